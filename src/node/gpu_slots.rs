//! Which GPU device ids a node hands to the actors it runs, with
//! fractional sharing (as in Ray).
//!
//! A [`GpuSlots`] holds, for each device id the node can see (the entries
//! of its own `CUDA_VISIBLE_DEVICES`, which may be indices such as `5` or
//! UUIDs such as `GPU-8f3c…`), the fraction of that device still free:
//! `1.0` is a whole free device, `0.0` a fully used one. A [`GpuTake`]
//! records which ids a request got and how much of each, so that giving
//! it back restores exactly that.
//!
//! [`GpuSlots::take`] follows these rules, in order:
//!
//! 1. An amount of `0` takes nothing: [`GpuTake::none`], no device (the
//!    caller then sets `CUDA_VISIBLE_DEVICES` to the empty string).
//! 2. Any other amount must be finite and above zero; a negative, NaN or
//!    infinite one is refused ([`GpuSlotError::BadAmount`]).
//! 3. An amount between 0 and 1 shares one device: the device with the
//!    *least* free fraction that still has the amount free (best fit, so
//!    whole devices stay whole for whole requests); on a tie, the earliest
//!    id. "Has the amount free" allows [`FRACTION_EPSILON`] of rounding, so
//!    that `0.1` taken ten times fills a device exactly and
//!    `0.3 + 0.3 + 0.4` fits on one. A fraction no single device has free
//!    is refused ([`GpuSlotError::NoFraction`]).
//! 4. An amount of 1 or more must be a whole number (within
//!    [`FRACTION_EPSILON`]), else it is refused
//!    ([`GpuSlotError::NotWhole`]). It takes that many devices that are
//!    wholly free (free fraction 1 within [`FRACTION_EPSILON`]), earliest
//!    ids first; a partly used device is never part of a whole request.
//!    Too few wholly free devices is refused
//!    ([`GpuSlotError::NotEnoughWhole`]).
//! 5. A refused request changes nothing.
//! 6. [`GpuSlots::give_back`] restores exactly what a take took, never
//!    raising a device above its capacity (1 for a node's devices); a
//!    share of an id not in the set is ignored.
//! 7. Placement-group bundles: [`GpuSlots::from_take`] turns what a bundle
//!    reserved from the node into a slot set of its own, whose devices
//!    have exactly the taken fractions as capacity, all free (a bundle
//!    that reserved `0.5` of device `5` can hand out `0.25` twice).
//!    [`GpuSlots::into_take`] returns what the bundle still holds unused as
//!    a take to give back to the node's slots; takes its actors still hold
//!    name the node's device ids, so they can be given back to the node
//!    later, too.
//!
//! A fraction left over after a take that is below [`FRACTION_EPSILON`]
//! counts as nothing: the take records the device's whole remaining
//! fraction and the device is left at exactly `0`, so free and taken
//! fractions always add up to what there was.

use std::fmt;

/// How far two GPU fractions may differ from rounding alone and still
/// count as equal (rules 3 and 4).
pub const FRACTION_EPSILON: f64 = 1e-9;

/// One device: its id, how much of it this set may hand out at most, and
/// how much of that is free now.
#[derive(Debug, Clone, PartialEq)]
struct Device {
    id: String,
    capacity: f64,
    free: f64,
}

/// The GPU devices of a node (or of a placement-group bundle) and the
/// fraction of each that is free. See the module documentation for the
/// rules.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSlots {
    devices: Vec<Device>,
}

/// What one [`GpuSlots::take`] got: device ids, in the slot set's order,
/// each with the fraction of it taken. Holds `f64` fractions, so it is
/// `PartialEq` but not `Eq` or `Hash`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuTake {
    shares: Vec<(String, f64)>,
}

/// Why a GPU request was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuSlotError {
    /// The amount is negative, NaN or infinite (rule 2).
    BadAmount(f64),
    /// The amount is above one GPU but not a whole number (rule 4).
    NotWhole(f64),
    /// No single device has this fraction free (rule 3); `free` lists
    /// what each device has free.
    NoFraction {
        /// The fraction asked for.
        amount: f64,
        /// Each device id with its free fraction, in the set's order.
        free: Vec<(String, f64)>,
    },
    /// Fewer devices are wholly free than asked for (rule 4).
    NotEnoughWhole {
        /// The number of whole devices asked for.
        wanted: f64,
        /// The number of wholly free devices.
        free: usize,
    },
}

impl fmt::Display for GpuSlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSlotError::BadAmount(amount) => write!(
                f,
                "{amount} GPUs: a GPU request must be a finite number, zero or more"
            ),
            GpuSlotError::NotWhole(amount) => write!(
                f,
                "{amount} GPUs: a request above one GPU must be a whole number (ask for 1, 2, …)"
            ),
            GpuSlotError::NoFraction { amount, free } => {
                write!(f, "no single GPU has {} free (", rounded(*amount))?;
                if free.is_empty() {
                    write!(f, "there are no GPUs here)")
                } else {
                    let each: Vec<String> = free
                        .iter()
                        .map(|(id, fraction)| format!("{id}: {}", rounded(*fraction)))
                        .collect();
                    write!(f, "free per GPU: {})", each.join(", "))
                }
            }
            GpuSlotError::NotEnoughWhole { wanted, free } => {
                let plural = if *wanted == 1.0 { "" } else { "s" };
                write!(f, "{wanted} whole GPU{plural} wanted, {free} free")
            }
        }
    }
}

impl std::error::Error for GpuSlotError {}

/// A fraction rounded to six decimals, for messages (`0.4` rather than
/// `0.40000000000000013`).
fn rounded(fraction: f64) -> String {
    let r = (fraction * 1e6).round() / 1e6;
    // `+ 0.0` turns `-0` into `0`.
    format!("{}", r + 0.0)
}

impl GpuSlots {
    /// A node's devices, by the ids it can see, every one whole and free.
    /// A repeated id counts once.
    pub fn new(ids: Vec<String>) -> Self {
        let mut devices: Vec<Device> = Vec::with_capacity(ids.len());
        for id in ids {
            if !devices.iter().any(|d| d.id == id) {
                devices.push(Device {
                    id,
                    capacity: 1.0,
                    free: 1.0,
                });
            }
        }
        GpuSlots { devices }
    }

    /// A placement-group bundle's devices (rule 7): the devices of `take`,
    /// each with exactly the fraction taken as its capacity, all free.
    pub fn from_take(take: &GpuTake) -> Self {
        let mut devices: Vec<Device> = Vec::with_capacity(take.shares.len());
        for (id, fraction) in &take.shares {
            match devices.iter_mut().find(|d| d.id == *id) {
                Some(device) => {
                    device.capacity = (device.capacity + fraction).min(1.0);
                    device.free = device.capacity;
                }
                None => devices.push(Device {
                    id: id.clone(),
                    capacity: *fraction,
                    free: *fraction,
                }),
            }
        }
        GpuSlots { devices }
    }

    /// Everything still free here, as a take to give back to the slots
    /// this set was made from with [`from_take`](Self::from_take) (rule 7).
    /// Devices with nothing free are left out.
    pub fn into_take(self) -> GpuTake {
        GpuTake {
            shares: self
                .devices
                .into_iter()
                .filter(|d| d.free > 0.0)
                .map(|d| (d.id, d.free))
                .collect(),
        }
    }

    /// The device ids, in order.
    pub fn ids(&self) -> Vec<&str> {
        self.devices.iter().map(|d| d.id.as_str()).collect()
    }

    /// Each device id with its free fraction, in order.
    pub fn free_per_gpu(&self) -> Vec<(&str, f64)> {
        self.devices
            .iter()
            .map(|d| (d.id.as_str(), d.free))
            .collect()
    }

    /// The free fractions of all devices added up.
    pub fn free(&self) -> f64 {
        self.devices.iter().map(|d| d.free).sum()
    }

    /// Takes `amount` GPUs by the rules in the module documentation; on
    /// failure nothing changes.
    pub fn take(&mut self, amount: f64) -> Result<GpuTake, GpuSlotError> {
        if !amount.is_finite() || amount < 0.0 {
            return Err(GpuSlotError::BadAmount(amount));
        }
        if amount == 0.0 {
            return Ok(GpuTake::none());
        }
        let whole = amount.round();
        if whole >= 1.0 && (amount - whole).abs() <= FRACTION_EPSILON {
            return self.take_whole(whole);
        }
        if amount > 1.0 {
            return Err(GpuSlotError::NotWhole(amount));
        }
        self.take_fraction(amount)
    }

    /// Rule 3: a share of the best-fitting device.
    fn take_fraction(&mut self, amount: f64) -> Result<GpuTake, GpuSlotError> {
        let mut best: Option<usize> = None;
        for (index, device) in self.devices.iter().enumerate() {
            let fits = device.free > 0.0 && device.free + FRACTION_EPSILON >= amount;
            let better = match best {
                None => true,
                Some(b) => device.free < self.devices[b].free - FRACTION_EPSILON,
            };
            if fits && better {
                best = Some(index);
            }
        }
        let Some(index) = best else {
            return Err(GpuSlotError::NoFraction {
                amount,
                free: self
                    .devices
                    .iter()
                    .map(|d| (d.id.clone(), d.free))
                    .collect(),
            });
        };
        let device = &mut self.devices[index];
        let taken = take_from(device, amount);
        Ok(GpuTake {
            shares: vec![(device.id.clone(), taken)],
        })
    }

    /// Rule 4: `wanted` (a whole number, at least 1) wholly free devices.
    fn take_whole(&mut self, wanted: f64) -> Result<GpuTake, GpuSlotError> {
        let wholly_free: Vec<usize> = self
            .devices
            .iter()
            .enumerate()
            .filter(|(_, d)| d.free >= 1.0 - FRACTION_EPSILON)
            .map(|(index, _)| index)
            .collect();
        if (wholly_free.len() as f64) < wanted {
            return Err(GpuSlotError::NotEnoughWhole {
                wanted,
                free: wholly_free.len(),
            });
        }
        // `wanted` is a whole number no larger than a length here.
        let shares = wholly_free
            .into_iter()
            .take(wanted as usize)
            .map(|index| {
                let device = &mut self.devices[index];
                let taken = take_from(device, 1.0);
                (device.id.clone(), taken)
            })
            .collect();
        Ok(GpuTake { shares })
    }

    /// Gives back what `take` took (rule 6): each share goes back to its
    /// device, never above the device's capacity; shares of ids not here
    /// are ignored.
    pub fn give_back(&mut self, take: GpuTake) {
        for (id, fraction) in take.shares {
            if let Some(device) = self.devices.iter_mut().find(|d| d.id == id) {
                let free = device.free + fraction;
                device.free = if free >= device.capacity - FRACTION_EPSILON {
                    device.capacity
                } else {
                    free
                };
            }
        }
    }
}

/// Takes `amount` of `device` (which has it free, within
/// [`FRACTION_EPSILON`]) and returns the fraction actually taken: all of
/// what was free when less than [`FRACTION_EPSILON`] would be left.
fn take_from(device: &mut Device, amount: f64) -> f64 {
    let left = device.free - amount;
    if left < FRACTION_EPSILON {
        let taken = device.free;
        device.free = 0.0;
        taken
    } else {
        device.free = left;
        amount
    }
}

impl GpuTake {
    /// A take of nothing (a 0-GPU request).
    pub fn none() -> Self {
        GpuTake { shares: Vec::new() }
    }

    /// The device ids taken, in order, for `CUDA_VISIBLE_DEVICES` (join
    /// them with `,`).
    pub fn ids(&self) -> Vec<String> {
        self.shares.iter().map(|(id, _)| id.clone()).collect()
    }

    /// Each device id taken with the fraction of it taken, in order.
    pub fn shares(&self) -> impl Iterator<Item = (&str, f64)> {
        self.shares
            .iter()
            .map(|(id, fraction)| (id.as_str(), *fraction))
    }

    /// Whether nothing was taken.
    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(ids: &[&str]) -> GpuSlots {
        GpuSlots::new(ids.iter().map(|id| id.to_string()).collect())
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn visible_ids_are_handed_out_as_they_are() {
        let mut gpus = slots(&["5", "6"]);
        assert_eq!(gpus.ids(), vec!["5", "6"]);
        assert_eq!(gpus.take(1.0).unwrap().ids(), vec!["5"]);
        let mut uuids = slots(&["GPU-8f3c", "GPU-1a2b"]);
        assert_eq!(uuids.take(2.0).unwrap().ids(), vec!["GPU-8f3c", "GPU-1a2b"]);
    }

    #[test]
    fn zero_gpus_take_no_device() {
        let mut gpus = slots(&["5"]);
        let none = gpus.take(0.0).unwrap();
        assert!(none.is_empty());
        assert_eq!(none, GpuTake::none());
        assert!(none.ids().is_empty());
        assert_eq!(gpus.free(), 1.0);
    }

    #[test]
    fn fractions_share_one_device_and_best_fit_keeps_a_whole_device_for_a_whole_request() {
        let mut gpus = slots(&["5", "6"]);
        let a = gpus.take(0.5).unwrap();
        let b = gpus.take(0.5).unwrap();
        assert_eq!(a.ids(), vec!["5"]);
        assert_eq!(b.ids(), vec!["5"]);
        assert_eq!(a.shares().collect::<Vec<_>>(), vec![("5", 0.5)]);
        assert_eq!(gpus.take(1.0).unwrap().ids(), vec!["6"]);
        assert_eq!(gpus.free(), 0.0);
    }

    #[test]
    fn a_fraction_goes_to_the_fullest_device_it_fits_on() {
        let mut gpus = slots(&["0", "1", "2"]);
        gpus.take(0.3).unwrap(); // "0" has 0.7 free
        let one = gpus.take(0.6).unwrap(); // best fit is "0", not a whole one
        assert_eq!(one.ids(), vec!["0"]);
        let two = gpus.take(0.2).unwrap(); // "0" has 0.1: too little; "1" and "2" tie
        assert_eq!(two.ids(), vec!["1"]);
    }

    #[test]
    fn a_tenth_taken_ten_times_fills_exactly_one_device() {
        let mut gpus = slots(&["5", "6"]);
        for _ in 0..10 {
            assert_eq!(gpus.take(0.1).unwrap().ids(), vec!["5"]);
        }
        assert_eq!(gpus.free_per_gpu(), vec![("5", 0.0), ("6", 1.0)]);
        assert_eq!(gpus.take(0.1).unwrap().ids(), vec!["6"]);
    }

    #[test]
    fn three_tenths_twice_and_four_tenths_fit_on_one_device() {
        let mut gpus = slots(&["5", "6"]);
        for amount in [0.3, 0.3, 0.4] {
            assert_eq!(gpus.take(amount).unwrap().ids(), vec!["5"]);
        }
        assert_eq!(gpus.free_per_gpu(), vec![("5", 0.0), ("6", 1.0)]);
    }

    #[test]
    fn a_fraction_that_fits_nowhere_fails_and_changes_nothing() {
        let mut gpus = slots(&["5", "6"]);
        gpus.take(0.6).unwrap();
        gpus.take(0.6).unwrap();
        let before = gpus.clone();
        let refused = gpus.take(0.5).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "no single GPU has 0.5 free (free per GPU: 5: 0.4, 6: 0.4)"
        );
        assert_eq!(gpus, before);
        let mut none = slots(&[]);
        assert_eq!(
            none.take(0.5).unwrap_err().to_string(),
            "no single GPU has 0.5 free (there are no GPUs here)"
        );
    }

    #[test]
    fn one_and_a_half_gpus_are_refused() {
        let mut gpus = slots(&["5", "6"]);
        let refused = gpus.take(1.5).unwrap_err();
        assert_eq!(refused, GpuSlotError::NotWhole(1.5));
        assert_eq!(
            refused.to_string(),
            "1.5 GPUs: a request above one GPU must be a whole number (ask for 1, 2, …)"
        );
        assert_eq!(gpus.free(), 2.0);
    }

    #[test]
    fn two_gpus_when_one_is_wholly_free_are_refused_with_the_counts() {
        let mut gpus = slots(&["5", "6"]);
        gpus.take(0.1).unwrap();
        let before = gpus.clone();
        let refused = gpus.take(2.0).unwrap_err();
        assert_eq!(refused.to_string(), "2 whole GPUs wanted, 1 free");
        assert_eq!(gpus, before);
        gpus.take(1.0).unwrap();
        assert_eq!(
            gpus.take(1.0).unwrap_err().to_string(),
            "1 whole GPU wanted, 0 free"
        );
    }

    #[test]
    fn amounts_that_are_not_finite_and_positive_are_refused() {
        let mut gpus = slots(&["5"]);
        for bad in [-1.0, -0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let refused = gpus.take(bad).unwrap_err();
            assert!(matches!(refused, GpuSlotError::BadAmount(_)), "{refused}");
            assert!(refused.to_string().contains("finite number"), "{refused}");
        }
        assert_eq!(gpus.free(), 1.0);
    }

    #[test]
    fn giving_back_restores_what_was_taken() {
        let mut gpus = slots(&["5", "6", "7"]);
        let fraction = gpus.take(0.25).unwrap();
        let whole = gpus.take(2.0).unwrap();
        assert_eq!(whole.ids(), vec!["6", "7"]);
        assert!(near(gpus.free(), 0.75));
        gpus.give_back(whole);
        assert!(near(gpus.free(), 2.75));
        gpus.give_back(fraction);
        assert_eq!(gpus, slots(&["5", "6", "7"]));
    }

    #[test]
    fn giving_back_to_an_unknown_id_is_ignored_and_never_overfills() {
        let mut other = slots(&["9"]);
        let foreign = other.take(1.0).unwrap();
        let mut gpus = slots(&["5"]);
        gpus.give_back(foreign);
        assert_eq!(gpus, slots(&["5"]));
        let taken = gpus.take(0.5).unwrap();
        gpus.give_back(taken.clone());
        gpus.give_back(taken);
        assert_eq!(gpus.free_per_gpu(), vec![("5", 1.0)]);
    }

    #[test]
    fn a_bundle_made_from_a_take_hands_out_fractions_of_it_and_gives_the_rest_back() {
        let mut node = slots(&["5", "6"]);
        let reserved = node.take(0.5).unwrap();
        let mut bundle = GpuSlots::from_take(&reserved);
        assert_eq!(bundle.ids(), vec!["5"]);
        assert_eq!(bundle.free(), 0.5);
        let a = bundle.take(0.25).unwrap();
        let b = bundle.take(0.25).unwrap();
        assert_eq!(a.ids(), vec!["5"]);
        assert_eq!(b.ids(), vec!["5"]);
        assert!(bundle.take(0.25).is_err());
        assert!(bundle.take(1.0).is_err());
        bundle.give_back(a);
        // Released with `b` still held: the rest goes back to the node now,
        // `b` later.
        let rest = bundle.into_take();
        assert_eq!(rest.shares().collect::<Vec<_>>(), vec![("5", 0.25)]);
        node.give_back(rest);
        assert!(near(node.free(), 1.75));
        node.give_back(b);
        assert_eq!(node, slots(&["5", "6"]));
    }

    #[test]
    fn a_bundle_of_whole_devices_hands_out_whole_devices() {
        let mut node = slots(&["5", "6", "7"]);
        let reserved = node.take(2.0).unwrap();
        let mut bundle = GpuSlots::from_take(&reserved);
        assert_eq!(bundle.take(1.0).unwrap().ids(), vec!["5"]);
        assert_eq!(bundle.take(0.5).unwrap().ids(), vec!["6"]);
        assert!(bundle.take(1.0).is_err());
        let rest = bundle.into_take();
        assert_eq!(rest.ids(), vec!["6"]);
    }

    /// A tiny xorshift generator, so the random test needs no crates and
    /// repeats exactly.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Per device: free in [0, 1], and free plus what takes hold of it
    /// is one whole device.
    fn check_invariants(node: &GpuSlots, held: &[GpuTake], context: &str) {
        let mut total_held = 0.0;
        for (id, free) in node.free_per_gpu() {
            assert!(
                (0.0..=1.0).contains(&free),
                "{context}: {id} has {free} free"
            );
            let held_here: f64 = held
                .iter()
                .flat_map(|t| t.shares())
                .filter(|(share_id, _)| *share_id == id)
                .map(|(_, fraction)| fraction)
                .sum();
            assert!(
                near(free + held_here, 1.0),
                "{context}: {id}: {free} + {held_here}"
            );
            total_held += held_here;
        }
        let devices = node.ids().len() as f64;
        assert!(near(node.free() + total_held, devices), "{context}");
    }

    /// Checks a successful take of `amount` has the shape rules 3 and 4 say.
    fn check_take(take: &GpuTake, amount: f64, context: &str) {
        let shares: Vec<(&str, f64)> = take.shares().collect();
        if amount == 0.0 {
            assert!(take.is_empty(), "{context}");
        } else if amount < 1.0 {
            assert_eq!(shares.len(), 1, "{context}");
            assert!(near(shares[0].1, amount), "{context}: {shares:?}");
        } else {
            assert_eq!(shares.len() as f64, amount, "{context}");
            assert!(shares.iter().all(|(_, f)| near(*f, 1.0)), "{context}");
        }
    }

    #[test]
    fn random_takes_and_give_backs_keep_the_books_balanced() {
        const AMOUNTS: [f64; 14] = [
            0.0,
            0.1,
            0.2,
            0.25,
            0.3,
            0.4,
            0.5,
            0.7,
            1.0,
            2.0,
            3.0,
            1.5,
            -1.0,
            f64::NAN,
        ];
        for seed in 0..20u64 {
            let mut rng =
                XorShift(0x9E37_79B9_7F4A_7C15 ^ (seed + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
            let devices = 1 + rng.below(4);
            let ids: Vec<String> = (0..devices).map(|i| format!("GPU-{}", 10 + i)).collect();
            let mut node = GpuSlots::new(ids);
            let mut held: Vec<GpuTake> = Vec::new();
            for step in 0..200 {
                let context = format!("seed {seed} step {step}");
                match rng.below(10) {
                    0..=4 => {
                        let amount = AMOUNTS[rng.below(AMOUNTS.len())];
                        let before = node.clone();
                        match node.take(amount) {
                            Ok(take) => {
                                check_take(&take, amount, &context);
                                held.push(take);
                            }
                            Err(_) => assert_eq!(node, before, "{context}"),
                        }
                    }
                    5..=7 => {
                        if !held.is_empty() {
                            let index = rng.below(held.len());
                            node.give_back(held.swap_remove(index));
                        }
                    }
                    _ => {
                        // A bundle: reserve, hand out from it, release it
                        // while some of its actors still hold shares.
                        let amount = [0.3, 0.5, 1.0, 2.0][rng.below(4)];
                        if let Ok(reserved) = node.take(amount) {
                            let mut bundle = GpuSlots::from_take(&reserved);
                            let reserved_total: f64 = reserved.shares().map(|(_, f)| f).sum();
                            assert!(near(bundle.free(), reserved_total), "{context}");
                            for _ in 0..rng.below(4) {
                                let inner = AMOUNTS[rng.below(AMOUNTS.len())];
                                let before = bundle.clone();
                                match bundle.take(inner) {
                                    Ok(take) => {
                                        check_take(&take, inner, &context);
                                        held.push(take);
                                    }
                                    Err(_) => assert_eq!(bundle, before, "{context}"),
                                }
                            }
                            held.push(bundle.into_take());
                        }
                    }
                }
                check_invariants(&node, &held, &context);
            }
            for take in held.drain(..) {
                node.give_back(take);
            }
            check_invariants(&node, &held, &format!("seed {seed} end"));
            for (id, free) in node.free_per_gpu() {
                assert_eq!(free, 1.0, "seed {seed}: {id} not whole again");
            }
            assert!(node.take(devices as f64).is_ok(), "seed {seed}");
        }
    }
}
