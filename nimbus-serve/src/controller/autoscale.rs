//! Autoscaling an application's replicas on their ongoing requests, as
//! plain state with the clock passed in (Ray Serve's policy).
//!
//! 1. Each health round ([`HEALTH_PERIOD`](super::HEALTH_PERIOD)) the
//!    controller adds up the requests its replicas held (running, or
//!    waiting in a replica's batch queue; each replica's time-weighted
//!    average since the round before), plus those waiting at the
//!    ingresses for a replica, and calls [`Autoscaler::decide`].
//! 2. The replicas wanted are `ceil(ongoing / target_ongoing_requests)`,
//!    kept within `min_replicas..=max_replicas`.
//! 3. More than now: once every round for `upscale_delay` has wanted more,
//!    the target becomes the latest round's want. Fewer: the same with
//!    `downscale_delay`. A round that wants the current count (or the
//!    other direction) starts the wait again, so a load that wavers
//!    around a boundary does not make the count swing.
//!    From zero replicas (`min_replicas` 0), a request waiting at an
//!    ingress scales up at once: it is held until a replica runs.
//! 4. While something else waits for the room the replicas hold (a
//!    training run that cannot be placed: `others_waiting`), the target
//!    goes down by one each round to `min_replicas`, without a delay, and
//!    never up; once nothing waits, the load decides again (so the
//!    replicas come back after the upscale delay).

use std::time::{Duration, Instant};

use crate::config::Autoscaling;

/// One application's replica count.
#[derive(Debug)]
pub(crate) struct Autoscaler {
    config: Autoscaling,
    target: u32,
    /// Since when every round has wanted to go up (`true`) or down.
    wanting: Option<(bool, Instant)>,
}

impl Autoscaler {
    /// Starts at `config`'s `min_replicas`.
    pub(crate) fn new(config: Autoscaling) -> Self {
        Autoscaler {
            target: config.min_replicas,
            config,
            wanting: None,
        }
    }

    /// Resumes at `target` replicas (a restarted controller's: `saved.rs`),
    /// within the configured bounds.
    pub(crate) fn resumed(config: Autoscaling, target: u32) -> Self {
        Autoscaler {
            target: target.clamp(config.min_replicas, config.max_replicas),
            config,
            wanting: None,
        }
    }

    /// The replicas the application should have now.
    pub(crate) fn target(&self) -> u32 {
        self.target
    }

    /// One round with `ongoing` requests on the replicas at `now`, and
    /// whether others wait for room the replicas hold: the new target when
    /// it changes.
    pub(crate) fn decide(
        &mut self,
        ongoing: f64,
        others_waiting: bool,
        now: Instant,
    ) -> Option<u32> {
        let config = &self.config;
        if others_waiting {
            self.wanting = None;
            if self.target <= config.min_replicas {
                return None;
            }
            self.target -= 1;
            return Some(self.target);
        }
        let wanted = (ongoing / config.target_ongoing_requests).ceil() as u32;
        let wanted = wanted.clamp(config.min_replicas, config.max_replicas);
        if wanted == self.target {
            self.wanting = None;
            return None;
        }
        if self.target == 0 {
            self.wanting = None;
            self.target = wanted;
            return Some(wanted);
        }
        let up = wanted > self.target;
        let since = match self.wanting {
            Some((direction, since)) if direction == up => since,
            _ => {
                self.wanting = Some((up, now));
                now
            }
        };
        let delay: Duration = if up {
            config.upscale_delay
        } else {
            config.downscale_delay
        };
        if now.saturating_duration_since(since) < delay {
            return None;
        }
        self.wanting = None;
        self.target = wanted;
        Some(wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic generator for the simulations (xorshift).
    struct Seeded(u64);

    impl Seeded {
        fn below(&mut self, n: u32) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % u64::from(n)) as u32
        }
    }

    fn config() -> Autoscaling {
        Autoscaling::new(1, 8)
            .target_ongoing_requests(2.0)
            .upscale_delay(Duration::from_secs(3))
            .downscale_delay(Duration::from_secs(10))
    }

    const ROUND: Duration = Duration::from_secs(1);

    /// Runs `rounds` rounds of `load(round, replicas)`; the target after
    /// each.
    fn simulate(
        scaler: &mut Autoscaler,
        rounds: u32,
        load: impl FnMut(u32, u32) -> u32,
    ) -> Vec<u32> {
        simulate_waiting(scaler, rounds, load, |_| false)
    }

    /// The same, with `waiting(round)`: whether others wait for room.
    fn simulate_waiting(
        scaler: &mut Autoscaler,
        rounds: u32,
        mut load: impl FnMut(u32, u32) -> u32,
        waiting: impl Fn(u32) -> bool,
    ) -> Vec<u32> {
        let start = Instant::now();
        (0..rounds)
            .map(|round| {
                let ongoing = load(round, scaler.target());
                scaler.decide(f64::from(ongoing), waiting(round), start + ROUND * round);
                scaler.target()
            })
            .collect()
    }

    #[test]
    fn a_steady_load_settles_and_does_not_oscillate() {
        for seed in 1..=20 {
            let mut random = Seeded(seed);
            let mut scaler = Autoscaler::new(config());
            // About 7 requests ongoing (6 to 8): 4 replicas at target 2.
            let targets = simulate(&mut scaler, 200, |_, _| 6 + random.below(3));
            let settled = &targets[50..];
            let changes = settled.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(changes <= 2, "seed {seed}: {changes} changes: {settled:?}");
            assert!(
                settled.iter().all(|&t| (3..=4).contains(&t)),
                "seed {seed}: {settled:?}"
            );
        }
    }

    #[test]
    fn a_step_up_scales_within_the_upscale_delay() {
        let mut scaler = Autoscaler::new(config());
        // Idle for 20 rounds, then 10 requests ongoing.
        let targets = simulate(&mut scaler, 40, |round, _| if round < 20 { 0 } else { 10 });
        assert!(targets[..20].iter().all(|&t| t == 1), "{targets:?}");
        let up = targets.iter().position(|&t| t == 5).expect("scaled up");
        assert_eq!(
            up, 23,
            "the load from round 20, the delay 3 rounds: {targets:?}"
        );
        assert!(targets[up..].iter().all(|&t| t == 5), "{targets:?}");
    }

    #[test]
    fn it_scales_down_only_after_the_downscale_delay_and_not_below_min() {
        let mut scaler = Autoscaler::new(config());
        let targets = simulate(&mut scaler, 60, |round, _| if round < 10 { 16 } else { 0 });
        assert_eq!(targets[9], 8, "up to max_replicas: {targets:?}");
        let down = targets.iter().rposition(|&t| t == 8).unwrap() + 1;
        assert_eq!(
            down, 20,
            "the load gone from round 10, the delay 10 rounds: {targets:?}"
        );
        assert!(targets[down..].iter().all(|&t| t == 1), "{targets:?}");
    }

    #[test]
    fn a_load_that_wavers_restarts_the_wait() {
        let mut scaler = Autoscaler::new(config());
        // High every other round: never 3 rounds in a row wanting more.
        let targets = simulate(
            &mut scaler,
            30,
            |round, _| if round % 2 == 0 { 10 } else { 1 },
        );
        assert!(targets.iter().all(|&t| t == 1), "{targets:?}");
    }

    #[test]
    fn replicas_are_given_back_while_others_wait_and_come_back_after() {
        let mut scaler = Autoscaler::new(config());
        // A steady 10 requests (5 replicas wanted); others wait in rounds
        // 20 to 29.
        let targets = simulate_waiting(
            &mut scaler,
            50,
            |_, _| 10,
            |round| (20..30).contains(&round),
        );
        assert_eq!(targets[19], 5, "{targets:?}");
        assert_eq!(
            &targets[20..24],
            &[4, 3, 2, 1],
            "one a round, without a delay: {targets:?}"
        );
        assert!(
            targets[24..30].iter().all(|&t| t == 1),
            "never up while others wait: {targets:?}"
        );
        let back = targets[30..].iter().position(|&t| t == 5).map(|at| at + 30);
        assert_eq!(
            back,
            Some(33),
            "the load decides again, after the upscale delay: {targets:?}"
        );
    }

    #[test]
    fn from_zero_a_waiting_request_scales_up_at_once_and_idle_goes_back_to_zero() {
        let mut scaler = Autoscaler::new(config_from(0));
        let start = Instant::now();
        let at = |s| start + Duration::from_secs(s);
        assert_eq!(scaler.target(), 0);
        assert_eq!(scaler.decide(0.0, false, at(0)), None);
        // One request held at an ingress: a replica at once, no delay.
        assert_eq!(scaler.decide(1.0, false, at(1)), Some(1));
        // Idle: back to zero after the downscale delay (10 s), not before.
        assert_eq!(scaler.decide(0.0, false, at(2)), None);
        assert_eq!(scaler.decide(0.0, false, at(11)), None);
        assert_eq!(scaler.decide(0.0, false, at(12)), Some(0));
    }

    fn config_from(min: u32) -> Autoscaling {
        Autoscaling {
            min_replicas: min,
            ..config()
        }
    }
}
