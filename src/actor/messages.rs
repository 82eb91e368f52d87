//! What callers send to worker processes.

use serde::{Deserialize, Serialize};

use crate::cluster::ActorId;

/// One message for the actor a worker hosts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ActorCall {
    /// The actor meant (a worker hosts one).
    pub actor: ActorId,
    /// The message's registered name.
    pub message: String,
    /// The message, MessagePack.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// An [`ActorCall`] as the worker reads it: its name and payload borrowed
/// from the request body they arrived in, which outlives the decoding of
/// the message (a megabyte payload is not copied once more on its way).
#[derive(Deserialize)]
pub(crate) struct ActorCallIn<'a> {
    pub(crate) actor: ActorId,
    #[serde(borrow)]
    pub(crate) message: &'a str,
    #[serde(borrow, with = "serde_bytes")]
    pub(crate) payload: &'a [u8],
}

/// MessagePack's marker of a map of three entries.
const MAP_OF_THREE: u8 = 0x83;
/// MessagePack's marker of a `bin` with a 32-bit length.
const BIN32: u8 = 0xc6;

/// Encodes the [`ActorCall`] of `message` (named `name`) for `actor`,
/// writing the message's encoding once, in place as the call's payload,
/// instead of encoding it on its own and copying it into the call: the
/// same bytes as `rmp_serde::to_vec_named(&ActorCall { .. })`, except that
/// the payload's length is always written in 32 bits.
pub(crate) fn encode_call<M: Serialize>(
    actor: ActorId,
    name: &str,
    message: &M,
    capacity: usize,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut out = Vec::with_capacity(capacity);
    out.push(MAP_OF_THREE);
    rmp_serde::encode::write_named(&mut out, "actor")?;
    rmp_serde::encode::write_named(&mut out, &actor)?;
    rmp_serde::encode::write_named(&mut out, "message")?;
    rmp_serde::encode::write_named(&mut out, name)?;
    rmp_serde::encode::write_named(&mut out, "payload")?;
    out.push(BIN32);
    let length_at = out.len();
    out.extend_from_slice(&[0; 4]);
    rmp_serde::encode::write_named(&mut out, message)?;
    let len = u32::try_from(out.len() - length_at - 4).map_err(|_| {
        rmp_serde::encode::Error::Syntax(format!("{name} encodes to more than 4 GiB"))
    })?;
    out[length_at..length_at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_encoded_in_place_decodes_as_the_call_it_stands_for() {
        let actor = ActorId::random();
        let message = (
            7u32,
            "hello".to_string(),
            serde_bytes::ByteBuf::from(vec![9u8; 300]),
        );
        let body = encode_call(actor, "my.Message", &message, 64).unwrap();
        let call: ActorCall = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(call.actor, actor);
        assert_eq!(call.message, "my.Message");
        assert_eq!(call.payload, rmp_serde::to_vec_named(&message).unwrap());
        let borrowed: ActorCallIn<'_> = rmp_serde::from_slice(&body).unwrap();
        assert_eq!(borrowed.actor, actor);
        assert_eq!(borrowed.message, "my.Message");
        assert_eq!(borrowed.payload, call.payload.as_slice());
        // An owned call decodes borrowed too (its payload's length in 8 or
        // 16 bits).
        let owned = rmp_serde::to_vec_named(&call).unwrap();
        let again: ActorCallIn<'_> = rmp_serde::from_slice(&owned).unwrap();
        assert_eq!(again.payload, call.payload.as_slice());
    }
}
