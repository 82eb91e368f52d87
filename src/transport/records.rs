//! TLS 1.3 records (RFC 8446 §5.2–5.3) sealed and opened outside rustls,
//! with the traffic secrets it hands over once a bulk stream's handshake is
//! done (`bulk.rs`), as the kernel's TLS offload does. The bytes on the
//! wire are the records rustls would send; what changes is where they are
//! made: in place, in one large buffer per stream, where rustls copies each
//! record it receives into a buffer of its own and reads in 4 KiB steps.
//!
//! 1. **Hand-over.** Once the ticket has gone through rustls, each end
//!    takes the key, IV and next sequence number of both directions
//!    ([`Direction::new`]). A bulk server sends no session tickets and the
//!    dialer nothing past its ticket, so no record is in flight then (an
//!    end that received one is refused: rustls would drop it).
//! 2. **Seal.** A record carries at most [`MAX_PLAINTEXT`] (16 KiB): a
//!    5-byte header (application data, version 3.3, length), the bytes and
//!    their content type, encrypted in place with the nonce "IV xor
//!    sequence number" and the header as associated data, then the tag.
//! 3. **Open.** A record longer than [`MAX_CIPHERTEXT`] or carrying more
//!    than [`MAX_PLAINTEXT`] (a reader counts on that bound), whose tag
//!    does not match (corrupted, forged, replayed or out of order: the
//!    sequence number is in the nonce) or whose type is not application
//!    data or an alert fails the stream.
//! 4. **Limit.** A direction seals or opens at most [`MAX_RECORDS`]
//!    (2^24, 256 GiB) records, under AES-GCM's limit in RFC 8446 §5.5
//!    (2^24.5); a longer stream fails rather than wear its key out (a
//!    failed bulk stream's bytes go over QUIC, which updates its keys).

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use rustls::ConnectionTrafficSecrets;

use super::error::RecordError;

/// The most bytes one record carries (step 2).
pub(super) const MAX_PLAINTEXT: usize = 1 << 14;
/// The longest record body accepted (step 3): RFC 8446's bound.
pub(super) const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// The most records one direction's key protects (step 4).
pub(super) const MAX_RECORDS: u64 = 1 << 24;
/// A record's header.
pub(super) const HEADER_LEN: usize = 5;
const TAG_LEN: usize = 16;
/// Bytes a record adds to those it carries: its header, its content type
/// and its tag.
pub(super) const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;
/// A full record's length on the wire.
const MAX_RECORD: usize = MAX_PLAINTEXT + OVERHEAD;

/// Content types (RFC 8446 §5.1).
pub(super) const APPLICATION_DATA: u8 = 23;
pub(super) const ALERT: u8 = 21;
/// The alert that ends a stream: level warning, `close_notify`.
pub(super) const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// Sizes `out` for the records that carry `len` bytes (step 2), each
/// full but the last, and returns where each record's bytes go: `out`'s
/// bytes are read in there, then sealed in place
/// ([`Direction::seal_laid_out`]).
pub(super) fn lay_out(len: usize, out: &mut Vec<u8>) -> Vec<&mut [u8]> {
    out.resize(len + len.div_ceil(MAX_PLAINTEXT) * OVERHEAD, 0);
    out.chunks_mut(MAX_RECORD)
        .map(|record| {
            let carried = record.len() - OVERHEAD;
            &mut record[HEADER_LEN..HEADER_LEN + carried]
        })
        .collect()
}

/// One direction of a stream: its key, IV and next sequence number.
pub(super) struct Direction {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

/// A record opened in place (step 3).
pub(super) struct Opened {
    /// Its content type.
    pub content_type: u8,
    /// Where its bytes are, in the buffer given.
    pub plain: std::ops::Range<usize>,
    /// The record's length on the wire.
    pub len: usize,
}

impl Direction {
    /// The direction whose next record is `seq`, under `secrets` (step 1).
    pub(super) fn new(
        (seq, secrets): (u64, ConnectionTrafficSecrets),
    ) -> Result<Self, RecordError> {
        let (algorithm, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(RecordError::Cipher),
        };
        let key = UnboundKey::new(algorithm, key.as_ref()).map_err(|_| RecordError::Cipher)?;
        let iv = iv.as_ref().try_into().map_err(|_| RecordError::Cipher)?;
        Ok(Direction {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (steps 2–4).
    fn nonce(&mut self) -> Result<Nonce, RecordError> {
        if self.seq >= MAX_RECORDS {
            return Err(RecordError::KeyWornOut);
        }
        let mut nonce = self.iv;
        for (byte, seq) in nonce[NONCE_LEN - 8..]
            .iter_mut()
            .zip(self.seq.to_be_bytes())
        {
            *byte ^= seq;
        }
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(nonce))
    }

    /// Appends `bytes` of `content_type` to `out` as records (step 2).
    pub(super) fn seal(
        &mut self,
        content_type: u8,
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        for piece in bytes.chunks(MAX_PLAINTEXT) {
            let start = out.len();
            out.extend_from_slice(&[0; HEADER_LEN]);
            out.extend_from_slice(piece);
            out.extend_from_slice(&[0; 1 + TAG_LEN]);
            self.seal_record(content_type, &mut out[start..])?;
        }
        Ok(())
    }

    /// Seals the records [`lay_out`] laid out in `out`, whose bytes were
    /// put in place (step 2).
    pub(super) fn seal_laid_out(
        &mut self,
        content_type: u8,
        out: &mut [u8],
    ) -> Result<(), RecordError> {
        for record in out.chunks_mut(MAX_RECORD) {
            self.seal_record(content_type, record)?;
        }
        Ok(())
    }

    /// Seals one record in place: `record` is room for its header, then
    /// its bytes, then room for its content type and tag (step 2).
    fn seal_record(&mut self, content_type: u8, record: &mut [u8]) -> Result<(), RecordError> {
        let inner = record.len() - HEADER_LEN - TAG_LEN;
        let [high, low] = ((inner + TAG_LEN) as u16).to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, high, low];
        record[..HEADER_LEN].copy_from_slice(&header);
        let (inner, tag_room) = record[HEADER_LEN..].split_at_mut(inner);
        inner[inner.len() - 1] = content_type;
        let nonce = self.nonce()?;
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), inner)
            .map_err(|_| RecordError::Malformed("too long to seal"))?;
        tag_room.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens, in place, the record at the start of `buf` if all of it is
    /// there (step 3).
    pub(super) fn open(&mut self, buf: &mut [u8]) -> Result<Option<Opened>, RecordError> {
        let Some(&[outer, _, _, high, low]) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        if outer != APPLICATION_DATA {
            return Err(RecordError::Malformed(
                "its outer type is not application data",
            ));
        }
        let len = usize::from(u16::from_be_bytes([high, low]));
        if !(TAG_LEN + 1..=MAX_CIPHERTEXT).contains(&len) {
            return Err(RecordError::Malformed("its length is out of bounds"));
        }
        let Some(body) = buf.get_mut(HEADER_LEN..HEADER_LEN + len) else {
            return Ok(None);
        };
        let header = [outer, 3, 3, high, low];
        let nonce = self.nonce()?;
        let inner = self
            .key
            .open_in_place(nonce, Aad::from(header), body)
            .map_err(|_| RecordError::Forged)?;
        // The bytes, their content type, then zeros (padding).
        let typed = inner
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(RecordError::Malformed("it has no content type"))?;
        if typed > MAX_PLAINTEXT {
            return Err(RecordError::Malformed("it carries more than 16 KiB"));
        }
        Ok(Some(Opened {
            content_type: inner[typed],
            plain: HEADER_LEN..HEADER_LEN + typed,
            len: HEADER_LEN + len,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Direction, Direction) {
        let secrets = || {
            (
                7,
                ConnectionTrafficSecrets::Aes256Gcm {
                    key: rustls::crypto::cipher::AeadKey::from([9; 32]),
                    iv: rustls::crypto::cipher::Iv::from([3; NONCE_LEN]),
                },
            )
        };
        (
            Direction::new(secrets()).unwrap(),
            Direction::new(secrets()).unwrap(),
        )
    }

    #[test]
    fn records_open_to_what_was_sealed_in_order() {
        let (mut sealer, mut opener) = pair();
        let bytes: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        sealer.seal(APPLICATION_DATA, &bytes, &mut wire).unwrap();
        sealer.seal(ALERT, &CLOSE_NOTIFY, &mut wire).unwrap();
        let (mut at, mut got, mut types) = (0, Vec::new(), Vec::new());
        while let Some(opened) = opener.open(&mut wire[at..]).unwrap() {
            got.extend_from_slice(&wire[at + opened.plain.start..at + opened.plain.end]);
            types.push(opened.content_type);
            at += opened.len;
        }
        assert_eq!(at, wire.len());
        assert_eq!(types, [23, 23, 23, 21], "three records of data, one alert");
        assert_eq!(&got[..bytes.len()], &bytes[..]);
        assert_eq!(&got[bytes.len()..], &CLOSE_NOTIFY);
    }

    #[test]
    fn a_changed_byte_a_partial_record_and_a_replay_are_caught() {
        let (mut sealer, mut opener) = pair();
        let mut wire = Vec::new();
        sealer.seal(APPLICATION_DATA, b"hello", &mut wire).unwrap();
        let whole = wire.len();
        assert!(opener.open(&mut wire[..whole - 1]).unwrap().is_none());
        let mut changed = wire.clone();
        changed[HEADER_LEN + 2] ^= 1;
        assert!(matches!(
            opener.open(&mut changed),
            Err(RecordError::Forged)
        ));
        // The sequence number moved on: the same record again fails too.
        let (mut sealer, mut opener) = pair();
        let mut wire = Vec::new();
        sealer.seal(APPLICATION_DATA, b"hello", &mut wire).unwrap();
        let mut again = wire.clone();
        assert!(opener.open(&mut wire).unwrap().is_some());
        assert!(matches!(opener.open(&mut again), Err(RecordError::Forged)));
        let mut long = vec![APPLICATION_DATA, 3, 3, 0xff, 0xff];
        assert!(matches!(
            opener.open(&mut long),
            Err(RecordError::Malformed(_))
        ));
    }

    /// A record carrying more than 16 KiB is refused (RFC 8446's
    /// `record_overflow`): a reader counts on that bound to know how many
    /// bytes are still to come.
    #[test]
    fn a_record_carrying_more_than_16_kib_is_refused() {
        let (mut sealer, mut opener) = pair();
        let mut record = vec![0; MAX_PLAINTEXT + 1 + OVERHEAD];
        sealer.seal_record(APPLICATION_DATA, &mut record).unwrap();
        assert!(matches!(
            opener.open(&mut record),
            Err(RecordError::Malformed(_))
        ));
        let (mut sealer, mut opener) = pair();
        let mut record = vec![0; MAX_PLAINTEXT + OVERHEAD];
        sealer.seal_record(APPLICATION_DATA, &mut record).unwrap();
        assert!(
            opener.open(&mut record).unwrap().is_some(),
            "16 KiB is fine"
        );
    }

    #[test]
    fn a_key_is_not_used_past_its_limit() {
        let (mut sealer, _) = pair();
        sealer.seq = MAX_RECORDS - 1;
        let mut wire = Vec::new();
        sealer.seal(APPLICATION_DATA, b"last", &mut wire).unwrap();
        assert!(matches!(
            sealer.seal(APPLICATION_DATA, b"one more", &mut wire),
            Err(RecordError::KeyWornOut)
        ));
    }

    /// Fuzzing the opener, as `tests/fuzz` fuzzes the decoders it can
    /// reach (this module is the transport's own): inputs built from valid
    /// records (data, an alert, a 4 KiB one, one padded with zeros),
    /// each mutated one to four times (bit flips, header bytes set to their
    /// edges, truncation, bytes inserted or repeated), and records sealed
    /// with the right key around any inner bytes at all, so the checks
    /// after decryption see arbitrary input too. Never a panic; what opens
    /// lies within the buffer and carries at most 16 KiB. Seeded, so a run
    /// repeats.
    #[test]
    fn the_opener_survives_mutated_and_arbitrary_records() {
        use rand::{Rng, SeedableRng};
        const INPUTS: usize = 20_000;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let seeds: Vec<Vec<u8>> = {
            let (mut sealer, _) = pair();
            let mut seal = |content_type, bytes: &[u8]| {
                let mut wire = Vec::new();
                sealer.seal(content_type, bytes, &mut wire).unwrap();
                wire
            };
            let padded = [b"x".as_slice(), &[APPLICATION_DATA], &[0; 40]].concat();
            vec![
                seal(APPLICATION_DATA, b"hello"),
                seal(ALERT, &CLOSE_NOTIFY),
                seal(APPLICATION_DATA, &[7; 4096]),
                seal(APPLICATION_DATA, &padded),
            ]
        };
        let edges = [0u8, 1, 3, 0x15, 0x17, 0x40, 0x41, 0x7f, 0x80, 0xff];
        for round in 0..INPUTS {
            let (_, mut opener) = pair();
            let mut input = if round % 4 == 3 {
                // Arbitrary inner bytes (content type and padding included)
                // under a valid tag.
                let (mut sealer, _) = pair();
                // Mostly short (ring's ciphers are slow in a debug build),
                // now and then past the 16 KiB bound.
                let inner = match rng.random_bool(0.02) {
                    true => rng.random_range(MAX_PLAINTEXT - 64..MAX_PLAINTEXT + 64),
                    false => rng.random_range(1..256),
                };
                let mut record = vec![0; HEADER_LEN + inner + TAG_LEN];
                for byte in &mut record[HEADER_LEN..HEADER_LEN + inner] {
                    *byte = if rng.random_bool(0.5) {
                        0
                    } else {
                        rng.random()
                    };
                }
                let content_type = record.get(HEADER_LEN + inner.max(1) - 1).copied();
                match sealer.seal_record(content_type.unwrap_or(0), &mut record) {
                    Ok(()) => record,
                    Err(_) => continue,
                }
            } else {
                let mut input = seeds[rng.random_range(0..seeds.len())].clone();
                for _ in 0..rng.random_range(1..=4) {
                    let at = rng.random_range(0..input.len().max(1));
                    match rng.random_range(0..5) {
                        0 if !input.is_empty() => input[at] ^= 1 << rng.random_range(0..8),
                        1 if !input.is_empty() => {
                            let header_byte = at % HEADER_LEN.min(input.len());
                            input[header_byte] = edges[rng.random_range(0..edges.len())];
                        }
                        2 => input.truncate(at),
                        3 => input.insert(at.min(input.len()), rng.random()),
                        _ => {
                            let piece = input[at.min(input.len())..].to_vec();
                            input.extend_from_slice(&piece[..piece.len().min(64)]);
                        }
                    }
                }
                input
            };
            let mut at = 0;
            while let Ok(Some(opened)) = opener.open(&mut input[at..]) {
                assert!(opened.plain.end <= opened.len, "round {round}");
                assert!(opened.plain.len() <= MAX_PLAINTEXT, "round {round}");
                assert!(at + opened.len <= input.len(), "round {round}");
                at += opened.len;
            }
        }
    }
}
