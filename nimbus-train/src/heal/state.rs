//! A worker's training state as it travels from a live peer to a
//! replacement: the `Checkpoint` the peer's loop makes for the current step
//! (parameters, optimizer state, data position, RNG seeds, schedule: the
//! loop's own values) and the peer's report count, encoded with MessagePack
//! and sent by broadcast through the new group.
//!
//! The exchange, every rank of the new group calling [`exchange`]:
//! 1. the source broadcasts a header of [`HEADER_VALUES`] values: the
//!    magic, the encoded state's length in bytes and the report count;
//! 2. the source broadcasts the encoded state, 4 bytes per `f32` slot
//!    (bit patterns, copied, never added);
//! 3. each rank decodes it; every tensor's SHA-256 is checked against the
//!    one the source computed ([`HealError::Digest`] names the tensor).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::HealError;
use crate::checkpoint::Checkpoint;
use crate::collective::Collective;

/// Marks a state header ("NIMH").
const MAGIC: u32 = 0x4e49_4d48;
/// Values of the header: magic, length (2 × 32 bits), reports (2 × 32).
const HEADER_VALUES: usize = 5;
/// The largest state accepted (a header saying more is corrupt).
const MAX_STATE_BYTES: u64 = 64 << 30;

/// One tensor on the wire.
#[derive(Serialize, Deserialize)]
struct WireTensor {
    name: String,
    kind: String,
    shape: Vec<i64>,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
    #[serde(with = "serde_bytes")]
    sha256: Vec<u8>,
}

/// A state on the wire.
#[derive(Serialize, Deserialize)]
struct Wire {
    /// The checkpoint's values, as JSON (they are JSON values already).
    values: String,
    tensors: Vec<WireTensor>,
}

/// The kinds a state's tensors may have, by name.
const KINDS: &[(&str, Kind)] = &[
    ("f32", Kind::Float),
    ("f64", Kind::Double),
    ("bf16", Kind::BFloat16),
    ("f16", Kind::Half),
    ("i64", Kind::Int64),
    ("i32", Kind::Int),
    ("i16", Kind::Int16),
    ("i8", Kind::Int8),
    ("u8", Kind::Uint8),
    ("bool", Kind::Bool),
];

/// A peer's state: what [`exchange`] hands every rank.
pub(crate) struct PeerState {
    /// The source's report count (the steps it has done).
    pub(crate) reports: u64,
    /// The state, as a checkpoint to resume the current step from.
    pub(crate) checkpoint: Checkpoint,
}

/// Encodes `checkpoint` (its tensors' bytes, each with its SHA-256).
pub(crate) fn encode(checkpoint: &Checkpoint) -> Result<Vec<u8>, HealError> {
    let mut tensors = Vec::with_capacity(checkpoint.tensors().len());
    for (name, tensor) in checkpoint.tensors() {
        let kind = tensor.kind();
        let kind_name = KINDS
            .iter()
            .find(|(_, k)| *k == kind)
            .map(|(n, _)| n.to_string())
            .ok_or_else(|| HealError::Encode(format!("tensor {name} is {kind:?}")))?;
        let tensor = tensor.contiguous();
        let numel = tensor.numel();
        let mut data = vec![0u8; numel * kind.elt_size_in_bytes()];
        tensor
            .f_copy_data_u8(&mut data, numel)
            .map_err(|e| HealError::Encode(format!("tensor {name}: {e}")))?;
        tensors.push(WireTensor {
            name: name.clone(),
            kind: kind_name,
            shape: tensor.size(),
            sha256: sha256(&data),
            data,
        });
    }
    let values = serde_json::to_string(checkpoint.values())
        .map_err(|e| HealError::Encode(format!("values: {e}")))?;
    rmp_serde::to_vec(&Wire { values, tensors }).map_err(|e| HealError::Encode(e.to_string()))
}

/// Decodes what [`encode`] made, checking every tensor's digest.
pub(crate) fn decode(bytes: &[u8]) -> Result<Checkpoint, HealError> {
    let wire: Wire = rmp_serde::from_slice(bytes).map_err(|e| HealError::Decode(e.to_string()))?;
    let values: BTreeMap<String, serde_json::Value> = serde_json::from_str(&wire.values)
        .map_err(|e| HealError::Decode(format!("values: {e}")))?;
    let mut checkpoint = Checkpoint::from_values(values);
    for t in wire.tensors {
        let kind = KINDS
            .iter()
            .find(|(n, _)| *n == t.kind)
            .map(|(_, k)| *k)
            .ok_or_else(|| HealError::Decode(format!("tensor {}: kind {:?}", t.name, t.kind)))?;
        if sha256(&t.data) != t.sha256 {
            return Err(HealError::Digest(t.name));
        }
        let numel = t
            .shape
            .iter()
            .try_fold(1usize, |n, &d| usize::try_from(d).ok()?.checked_mul(n));
        if numel.and_then(|n| n.checked_mul(kind.elt_size_in_bytes())) != Some(t.data.len()) {
            return Err(HealError::Decode(format!(
                "tensor {}: shape {:?} of {:?} does not hold {} bytes",
                t.name,
                t.shape,
                kind,
                t.data.len()
            )));
        }
        let tensor = Tensor::f_from_data_size(&t.data, &t.shape, kind)
            .map_err(|e| HealError::Decode(format!("tensor {}: {e}", t.name)))?;
        checkpoint = checkpoint.with_tensor(t.name, &tensor);
    }
    Ok(checkpoint)
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .to_vec()
}

/// Steps 1 to 3 of the module docs, on every rank of the new group:
/// `mine` is the source's encoded state and report count (`None` on the
/// other ranks).
pub(crate) fn exchange(
    collective: &mut dyn Collective,
    source: usize,
    mine: Option<(Vec<u8>, u64)>,
) -> Result<PeerState, HealError> {
    let mut header = [0f32; HEADER_VALUES];
    if let Some((bytes, reports)) = &mine {
        let len = bytes.len() as u64;
        header = [
            MAGIC,
            len as u32,
            (len >> 32) as u32,
            *reports as u32,
            (*reports >> 32) as u32,
        ]
        .map(f32::from_bits);
    }
    collective.broadcast(&mut header, source)?;
    let [magic, len_lo, len_hi, reports_lo, reports_hi] = header.map(f32::to_bits);
    let len = u64::from(len_lo) | u64::from(len_hi) << 32;
    if magic != MAGIC || len > MAX_STATE_BYTES {
        return Err(HealError::Decode(format!(
            "the state's header is not one (magic {magic:#x}, {len} bytes)"
        )));
    }
    let reports = u64::from(reports_lo) | u64::from(reports_hi) << 32;
    let slots = (len as usize).div_ceil(4);
    let mut body: Vec<f32> = match &mine {
        Some((bytes, _)) => bytes
            .chunks(4)
            .map(|c| {
                let mut word = [0u8; 4];
                word[..c.len()].copy_from_slice(c);
                f32::from_bits(u32::from_le_bytes(word))
            })
            .collect(),
        None => vec![0f32; slots],
    };
    collective.broadcast(&mut body, source)?;
    let mut bytes: Vec<u8> = body
        .iter()
        .flat_map(|v| v.to_bits().to_le_bytes())
        .collect();
    bytes.truncate(len as usize);
    Ok(PeerState {
        reports,
        checkpoint: decode(&bytes)?.at_index(reports),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Checkpoint {
        Checkpoint::new()
            .with_tensor("model.w", &Tensor::from_slice(&[1.5f32, -0.0, f32::NAN]))
            .with_tensor("model.b", &Tensor::from_slice(&[3i64, 4]).view([2, 1]))
            .with_value("epoch", 2)
            .unwrap()
    }

    #[test]
    fn a_state_decodes_to_the_same_bits() {
        let bytes = encode(&state()).unwrap();
        let back = decode(&bytes).unwrap();
        assert_eq!(back.value::<u64>("epoch").unwrap(), 2);
        let w = Vec::<f32>::try_from(back.tensor("model.w").unwrap()).unwrap();
        assert_eq!(
            w.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [1.5f32, -0.0, f32::NAN].map(f32::to_bits)
        );
        assert_eq!(back.tensor("model.b").unwrap().size(), [2, 1]);
    }

    #[test]
    fn a_flipped_byte_names_its_tensor() {
        let mut bytes = encode(&state()).unwrap();
        // The first tensor's data is the 12 bytes of 1.5, -0.0, NaN.
        let at = bytes
            .windows(4)
            .position(|w| w == 1.5f32.to_le_bytes())
            .unwrap();
        bytes[at] ^= 1;
        match decode(&bytes) {
            Err(HealError::Digest(name)) => assert_eq!(name, "model.w"),
            other => panic!("not a digest error: {:?}", other.err()),
        }
    }

    #[test]
    fn the_exchange_of_a_group_of_one_hands_the_state_back() {
        let mut solo = crate::collective::SoloGroup;
        let bytes = encode(&state()).unwrap();
        let got = exchange(&mut solo, 0, Some((bytes, 17))).unwrap();
        assert_eq!(got.reports, 17);
        assert_eq!(got.checkpoint.index(), 17);
        assert_eq!(got.checkpoint.value::<u64>("epoch").unwrap(), 2);
    }
}
