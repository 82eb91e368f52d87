//! The idx format of MNIST: a big-endian magic (`0x0000 08 NN`: unsigned
//! bytes, NN dimensions), the dimensions as big-endian u32, then the bytes.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Why an idx file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IdxError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// It is not a (byte) idx file of the right shape.
    #[error("{path} is not a usable idx file: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// Reads an idx file of unsigned bytes (gzipped or not): its dimensions
/// and its data.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>), IdxError> {
    let io = |source| IdxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let format = |detail: String| IdxError::Format {
        path: path.to_path_buf(),
        detail,
    };
    let raw = std::fs::read(path).map_err(io)?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        raw
    };
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(format("no idx magic number".into()));
    }
    if bytes[2] != 0x08 {
        return Err(format(format!(
            "element type 0x{:02x}, expected unsigned bytes (0x08)",
            bytes[2]
        )));
    }
    let rank = bytes[3] as usize;
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(format(format!("truncated header of {rank} dimensions")));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let expected = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match expected {
        Some(expected) if bytes.len() - header == expected => Ok((dims, bytes[header..].to_vec())),
        _ => Err(format(format!(
            "dimensions {dims:?} do not match the {} data bytes",
            bytes.len() - header
        ))),
    }
}

#[cfg(test)]
mod tests {
    // Paths, not `use super::*`: this file is also compiled into test
    // binaries without a libtest harness, where the tests are left out.
    #[test]
    fn reads_plain_files_and_names_bad_ones() {
        use super::read_idx;
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("labels");
        std::fs::write(&good, [0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]).unwrap();
        assert_eq!(read_idx(&good).unwrap(), (vec![3], vec![7, 8, 9]));
        let short = dir.path().join("short");
        std::fs::write(&short, [0, 0, 8, 1, 0, 0, 0, 4, 7]).unwrap();
        let err = read_idx(&short).unwrap_err().to_string();
        assert!(err.contains("do not match"), "{err}");
        let floats = dir.path().join("floats");
        std::fs::write(&floats, [0, 0, 0x0d, 1, 0, 0, 0, 0]).unwrap();
        assert!(read_idx(&floats)
            .unwrap_err()
            .to_string()
            .contains("unsigned bytes"));
    }
}
