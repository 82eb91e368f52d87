//! Large frames between two processes of one host through shared memory:
//! one copy in, read in place, instead of a stream of socket writes and
//! reads (`local.rs`).
//!
//! Each same-host socket has two rings, one per direction, each written
//! by one end and read by the other:
//!
//! 1. **Setup.** Once a socket is admitted (`local.rs`, step 3), each end
//!    makes a ring for what it will write: an anonymous memory file
//!    (`memfd`, no name in any file system, gone with the last mapping) of
//!    [`RING_HEADER`] + [`RING_BYTES`], sealed against resizing, which it
//!    maps and hands to the other end over the socket (`SCM_RIGHTS`),
//!    with one byte. The dialer sends first; the acceptor answers with its
//!    own. The reader checks the file's size and seals, maps it, and
//!    closes the descriptor. Pages are allocated as they are first
//!    written, so a channel that never carries a large frame costs no
//!    memory; one that did keeps what it used, at most [`RING_BYTES`] per
//!    direction, until it ends (the pages stay warm for the next frame).
//! 2. **Write.** Frames whose batch reaches [`SHARED_FRAME_MIN`] bytes are
//!    encoded straight into a free contiguous region of the writer's ring
//!    (wrapping to its start when the end has no room), and the socket
//!    carries only a [`MARKER_BYTES`] marker: the length prefix
//!    [`MARKER`] (larger than any frame a peer accepts, so a peer without
//!    a ring refuses it as too large), the region's start (a byte count
//!    since the ring was made) and its length. A region holds whole
//!    frames, each with its length prefix. With no room (the reader is
//!    behind by [`RING_BYTES`]) the frames go through the socket as
//!    before: the ring never makes a writer wait.
//! 3. **Read.** The reader checks the region lies inside the ring, reads
//!    its frames in place (each decoded straight from shared memory),
//!    then marks it free: the header's first 8 bytes hold the end of the
//!    last region read (a release store; the writer loads it with
//!    acquire before reusing that memory). Regions are read in the order
//!    their markers arrive, which is the order they were written.
//! 4. **End.** A ring lives as long as its socket: both ends unmap theirs
//!    when the channel ends.
//!
//! Both ends run as the same user (`SO_PEERCRED`, `local.rs`); a peer
//! that writes into a region it handed over, or marks as free what it has
//! not read, only garbles its own channel's frames, which then fail to
//! decode like any bad frame.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::io::Interest;
use tokio::net::UnixStream;

use crate::wire::frame::{body_len, LENGTH_PREFIX_BYTES};
use crate::wire::WireError;

/// Bytes of a ring's data area.
pub(super) const RING_BYTES: usize = 64 << 20;

/// Bytes before the data area: the reader's release counter, on a page of
/// its own.
pub(super) const RING_HEADER: usize = 4096;

/// A batch of frames this large or larger goes through the ring: below
/// it, the socket's copies cost less than a region's bookkeeping.
pub(super) const SHARED_FRAME_MIN: usize = 64 << 10;

/// The length prefix that marks a region in the ring (step 2).
pub(super) const MARKER: u32 = u32::MAX;

/// Bytes of a marker on the socket: the prefix, the start (u64) and the
/// length (u32), big-endian.
pub(super) const MARKER_BYTES: usize = 16;

/// A marker, ready to write to the socket.
pub(super) type Marker = [u8; MARKER_BYTES];

/// The ring's mapping, shared by both ends.
struct Mapping(memmap2::MmapRaw);

impl Mapping {
    /// Maps `file`, which must be a ring's size.
    fn of(file: &std::fs::File) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        if len != (RING_HEADER + RING_BYTES) as u64 {
            return Err(std::io::Error::other(format!(
                "the peer's ring is {len} bytes, not {}",
                RING_HEADER + RING_BYTES
            )));
        }
        memmap2::MmapOptions::new().map_raw(file).map(Mapping)
    }

    /// The end of the last region the reader is done with.
    fn released(&self) -> &AtomicU64 {
        // SAFETY: the mapping is page-aligned and at least RING_HEADER
        // bytes long, so its first 8 bytes are an aligned u64 that lives
        // as long as `self`; both ends only touch it atomically.
        unsafe { &*self.0.as_mut_ptr().cast::<AtomicU64>() }
    }

    /// The data area's `len` bytes at `offset`, which the caller has
    /// checked lie inside it.
    fn data(&self, offset: usize, len: usize) -> *mut u8 {
        debug_assert!(offset + len <= RING_BYTES);
        // SAFETY: RING_HEADER + offset + len is within the mapping.
        unsafe { self.0.as_mut_ptr().add(RING_HEADER + offset) }
    }
}

/// Step 1: a new ring to write into, and the descriptor to hand the
/// reader.
pub(super) fn create() -> std::io::Result<(RingWriter, OwnedFd)> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "nimbus-ring",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, (RING_HEADER + RING_BYTES) as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    let file = std::fs::File::from(fd);
    let mapping = Mapping::of(&file)?;
    let writer = RingWriter {
        mapping,
        written: 0,
        regions: 0,
    };
    Ok((writer, file.into()))
}

/// Step 1: the reader's side of a ring the peer handed over.
pub(super) fn open(fd: OwnedFd) -> std::io::Result<RingReader> {
    use rustix::fs::SealFlags;
    let seals = rustix::fs::fcntl_get_seals(&fd)?;
    if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
        return Err(std::io::Error::other(
            "the peer's ring can be resized (it is not sealed)",
        ));
    }
    let mapping = Mapping::of(&std::fs::File::from(fd))?;
    Ok(RingReader { mapping })
}

/// Step 1: hands `fd` to the peer, with one byte.
pub(super) async fn send_fd(stream: &UnixStream, fd: &OwnedFd) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    loop {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            let fds = [fd.as_fd()];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            control.push(SendAncillaryMessage::ScmRights(&fds));
            rustix::net::sendmsg(
                stream,
                &[IoSlice::new(&[1])],
                &mut control,
                SendFlags::empty(),
            )
            .map_err(std::io::Error::from)
        });
        match sent {
            Ok(1) => return Ok(()),
            Ok(_) => return Err(std::io::ErrorKind::WriteZero.into()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Step 1: the descriptor the peer handed over with one byte.
pub(super) async fn receive_fd(stream: &UnixStream) -> std::io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    loop {
        stream.readable().await?;
        let received = stream.try_io(Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = rustix::net::recvmsg(
                stream,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            if got.bytes == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let mut fds = control.drain().filter_map(|message| match message {
                RecvAncillaryMessage::ScmRights(fds) => Some(fds),
                _ => None,
            });
            fds.next()
                .and_then(|mut fds| fds.next())
                .ok_or_else(|| std::io::Error::other("the peer sent no ring"))
        });
        match received {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// The writing end of a ring (step 2).
pub(super) struct RingWriter {
    mapping: Mapping,
    /// The end of the last region written (a byte count since the ring
    /// was made: its offset is this modulo [`RING_BYTES`]).
    written: u64,
    /// Regions written (and not taken back).
    regions: u64,
}

/// A region written but not yet announced: [`RingWriter::undo`] takes it
/// back if its marker cannot be sent.
pub(super) struct Written {
    pub(super) marker: Marker,
    before: u64,
}

impl RingWriter {
    /// Writes `frames` (whole frames, each with its length prefix) and
    /// then `value` as one more frame into a free region; `None` when the
    /// ring has no room for `frames` and `size_hint` more bytes, or the
    /// encoding is larger than `size_hint` allows or `max` (the caller
    /// then sends them through the socket).
    pub(super) fn write<T: Serialize>(
        &mut self,
        frames: &[u8],
        value: Option<&T>,
        size_hint: usize,
        max: usize,
    ) -> Option<Written> {
        let room = frames.len() + size_hint;
        let (start, offset) = self.free_region(room)?;
        // SAFETY: `free_region` checked that [offset, offset + room) lies
        // in the data area and that the reader is done with it; the
        // reader does not look at it until the marker is sent.
        let region =
            unsafe { std::slice::from_raw_parts_mut(self.mapping.data(offset, room), room) };
        region[..frames.len()].copy_from_slice(frames);
        let mut used = frames.len();
        if let Some(value) = value {
            used += encode_frame(value, &mut region[used..], max)?;
        }
        let before = self.written;
        self.written = start + used as u64;
        self.regions += 1;
        let mut marker = [0u8; MARKER_BYTES];
        marker[..4].copy_from_slice(&MARKER.to_be_bytes());
        marker[4..12].copy_from_slice(&start.to_be_bytes());
        marker[12..].copy_from_slice(&(used as u32).to_be_bytes());
        Some(Written { marker, before })
    }

    /// Writes `frames` (whole frames, already encoded) into a free region
    /// if they are [`SHARED_FRAME_MIN`] bytes or more and the ring has
    /// room; `None` sends them through the socket.
    pub(super) fn write_large(&mut self, frames: &[u8]) -> Option<Written> {
        if frames.len() < SHARED_FRAME_MIN {
            return None;
        }
        self.write::<()>(frames, None, 0, usize::MAX)
    }

    /// Takes back the region just written (its marker was not sent).
    pub(super) fn undo(&mut self, written: Written) {
        self.written = written.before;
        self.regions -= 1;
    }

    /// Regions written so far.
    pub(super) fn regions(&self) -> u64 {
        self.regions
    }

    /// Where `len` contiguous free bytes begin: the start as a count since
    /// the ring was made, and its offset in the data area.
    fn free_region(&self, len: usize) -> Option<(u64, usize)> {
        let ring = RING_BYTES as u64;
        let len64 = len as u64;
        if len64 > ring {
            return None;
        }
        let released = self.mapping.released().load(Ordering::Acquire);
        // A peer cannot release what was never written.
        let released = released.min(self.written);
        let next_lap = self.written.div_ceil(ring) * ring;
        let at_offset = self.written % ring;
        // An empty ring starts again at its beginning, whose pages the
        // last frames warmed; otherwise at the next bytes, or on the next
        // lap when the end of the ring has no room, so long as the region
        // ends a lap short of the first byte not yet released.
        if released == self.written {
            return Some((next_lap, 0));
        }
        let start = if at_offset + len64 > ring {
            next_lap
        } else {
            self.written
        };
        (start + len64 - released <= ring).then_some((start, (start % ring) as usize))
    }
}

/// Encodes `value` as a frame (length prefix included) into `out`;
/// `None` if it does not fit or is over `max`.
fn encode_frame<T: Serialize>(value: &T, out: &mut [u8], max: usize) -> Option<usize> {
    let (prefix, body) = out.split_at_mut_checked(LENGTH_PREFIX_BYTES)?;
    let mut cursor = std::io::Cursor::new(body);
    rmp_serde::encode::write_named(&mut cursor, value).ok()?;
    let len = cursor.position() as usize;
    if len > max {
        return None;
    }
    prefix.copy_from_slice(&(len as u32).to_be_bytes());
    Some(LENGTH_PREFIX_BYTES + len)
}

/// The reading end of a ring (step 3).
pub(super) struct RingReader {
    mapping: Mapping,
}

// SAFETY: the mapping is shared memory reached through raw pointers; the
// reader only reads regions handed over and writes the release counter
// atomically.
unsafe impl Send for RingReader {}
// SAFETY: as for `Send`.
unsafe impl Send for RingWriter {}

/// A region of frames being read, from a marker's 12 bytes after the
/// prefix.
#[derive(Clone, Copy)]
pub(super) struct Region {
    start: u64,
    len: usize,
    /// Bytes of it read so far.
    read: usize,
}

impl Region {
    /// Whether every frame of it has been read.
    pub(super) fn done(&self) -> bool {
        self.read == self.len
    }
}

impl RingReader {
    /// Checks a marker's start and length (the 12 bytes after its prefix)
    /// against the ring.
    pub(super) fn region(&self, rest: [u8; MARKER_BYTES - 4]) -> Result<Region, WireError> {
        let start = u64::from_be_bytes(rest[..8].try_into().unwrap_or_default());
        let len = u32::from_be_bytes(rest[8..].try_into().unwrap_or_default()) as usize;
        let offset = (start % RING_BYTES as u64) as usize;
        if len == 0 || offset + len > RING_BYTES {
            return Err(bad_region(format!(
                "a region of {len} bytes at offset {offset} does not lie in the {RING_BYTES}-byte ring"
            )));
        }
        Ok(Region {
            start,
            len,
            read: 0,
        })
    }

    /// The next frame of `region`, read in place, after checking its
    /// length prefix against `max` and the region.
    pub(super) fn next_frame<'a>(
        &'a self,
        region: &mut Region,
        max: usize,
    ) -> Result<&'a [u8], WireError> {
        let offset = (region.start % RING_BYTES as u64) as usize + region.read;
        let left = region.len - region.read;
        if left < LENGTH_PREFIX_BYTES {
            return Err(bad_region(format!(
                "{left} bytes left in a region, too few for a frame"
            )));
        }
        let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
        // SAFETY: `region` was checked to lie in the data area, and the
        // writer does not touch it until it is released.
        let bytes = unsafe { std::slice::from_raw_parts(self.mapping.data(offset, left), left) };
        prefix.copy_from_slice(&bytes[..LENGTH_PREFIX_BYTES]);
        let len = body_len(prefix, max)?;
        let frame = bytes
            .get(LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + len)
            .ok_or_else(|| {
                bad_region(format!(
                    "a frame of {len} bytes runs past the end of its {left}-byte region"
                ))
            })?;
        region.read += LENGTH_PREFIX_BYTES + len;
        Ok(frame)
    }

    /// Step 3: the writer may reuse `region` (every frame of it read and
    /// done with).
    pub(super) fn release(&self, region: &Region) {
        let end = region.start + region.len as u64;
        self.mapping.released().store(end, Ordering::Release);
    }
}

fn bad_region(detail: String) -> WireError {
    WireError::Decode {
        what: "shared-memory region",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    /// A ring's two ends in one process.
    fn ring() -> (RingWriter, RingReader) {
        let (writer, fd) = create().unwrap();
        (writer, open(fd).unwrap())
    }

    fn region(written: &Written) -> [u8; MARKER_BYTES - 4] {
        assert_eq!(written.marker[..4], MARKER.to_be_bytes());
        written.marker[4..].try_into().unwrap()
    }

    /// The frames of the region a marker names, read in place.
    fn read_all(reader: &RingReader, written: &Written) -> Vec<Vec<u8>> {
        let mut region = reader.region(region(written)).unwrap();
        let mut frames = Vec::new();
        while !region.done() {
            frames.push(reader.next_frame(&mut region, 1 << 30).unwrap().to_vec());
        }
        reader.release(&region);
        frames
    }

    fn frame(bytes: &[u8]) -> Vec<u8> {
        wire::encode(&serde_bytes::ByteBuf::from(bytes.to_vec()), 1 << 30).unwrap()
    }

    #[test]
    fn frames_and_a_value_written_together_are_read_back_in_order() {
        let (mut writer, reader) = ring();
        let frames = [frame(b"first"), frame(b"second")].concat();
        let value = serde_bytes::ByteBuf::from(vec![7u8; 100 << 10]);
        let written = writer
            .write(&frames, Some(&value), (100 << 10) + 64, 1 << 30)
            .unwrap();
        let read = read_all(&reader, &written);
        assert_eq!(read.len(), 3);
        let decoded: Vec<serde_bytes::ByteBuf> =
            read.iter().map(|f| wire::decode(f).unwrap()).collect();
        assert_eq!(decoded[0].as_slice(), b"first");
        assert_eq!(decoded[1].as_slice(), b"second");
        assert_eq!(decoded[2], value);
    }

    #[test]
    fn a_full_ring_refuses_until_read_and_an_empty_one_starts_over() {
        let (mut writer, reader) = ring();
        let big = vec![1u8; RING_BYTES / 3];
        let one = writer.write::<()>(&frame(&big), None, 0, 1 << 30).unwrap();
        let two = writer.write::<()>(&frame(&big), None, 0, 1 << 30).unwrap();
        // A third fits only by wrapping over the first, not read yet.
        assert!(writer.write::<()>(&frame(&big), None, 0, 1 << 30).is_none());
        assert_eq!(read_all(&reader, &one).len(), 1);
        let three = writer.write::<()>(&frame(&big), None, 0, 1 << 30).unwrap();
        let start = |w: &Written| u64::from_be_bytes(w.marker[4..12].try_into().unwrap());
        assert_eq!(start(&three), RING_BYTES as u64, "wrapped to the start");
        assert_eq!(read_all(&reader, &two).len(), 1);
        assert_eq!(read_all(&reader, &three).len(), 1);
        // Empty: the next region starts at the ring's beginning again.
        let four = writer
            .write::<()>(&frame(b"small"), None, 0, 1 << 30)
            .unwrap();
        assert_eq!(start(&four) % RING_BYTES as u64, 0);
        writer.undo(four);
        let again = writer
            .write::<()>(&frame(b"small"), None, 0, 1 << 30)
            .unwrap();
        assert_eq!(start(&again) % RING_BYTES as u64, 0);
        // Larger than the whole ring: never.
        assert!(writer
            .write::<()>(&vec![0u8; RING_BYTES + 1], None, 0, 1 << 30)
            .is_none());
    }

    #[test]
    fn a_value_larger_than_its_hint_or_the_limit_is_not_written() {
        let (mut writer, reader) = ring();
        let value = serde_bytes::ByteBuf::from(vec![1u8; 1000]);
        assert!(writer.write(&[], Some(&value), 500, 1 << 30).is_none());
        assert!(writer.write(&[], Some(&value), 2000, 100).is_none());
        let written = writer.write(&[], Some(&value), 2000, 2000).unwrap();
        assert_eq!(read_all(&reader, &written).len(), 1);
    }

    #[test]
    fn a_region_outside_the_ring_or_with_a_frame_past_its_end_is_refused() {
        let (mut writer, reader) = ring();
        let mut outside = [0u8; MARKER_BYTES - 4];
        outside[..8].copy_from_slice(&((RING_BYTES - 10) as u64).to_be_bytes());
        outside[8..].copy_from_slice(&100u32.to_be_bytes());
        let error = reader.region(outside).err().unwrap().to_string();
        assert!(error.contains("does not lie in"), "{error}");
        // A region cut short of its frame's length.
        let written = writer
            .write::<()>(&frame(&[5; 300]), None, 0, 1 << 30)
            .unwrap();
        let mut short = region(&written);
        short[8..].copy_from_slice(&100u32.to_be_bytes());
        let mut region = reader.region(short).unwrap();
        let error = reader
            .next_frame(&mut region, 1 << 30)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("runs past the end"), "{error}");
        // A frame over the reader's limit.
        let mut region = reader.region(self::region(&written)).unwrap();
        let error = reader.next_frame(&mut region, 100).err().unwrap();
        assert!(matches!(error, WireError::FrameTooLarge { .. }), "{error}");
    }

    #[test]
    fn a_ring_of_another_size_is_refused() {
        let fd = rustix::fs::memfd_create("not-a-ring", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let error = open(fd).err().unwrap().to_string();
        assert!(
            error.contains("not sealed") || error.contains("bytes, not"),
            "{error}"
        );
    }
}
