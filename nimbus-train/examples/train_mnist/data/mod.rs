//! Image-classification datasets of the MNIST example (and the training
//! tests and benchmarks that run its loop): MNIST-format idx files (gzipped
//! or not), and an embedded, generated digit dataset so everything runs
//! offline.

mod digits;
mod idx;
pub mod parquet;

use std::path::Path;

use nimbus_train::tch::{Kind, Tensor};

pub use digits::generate_digits;
pub use idx::{read_idx, IdxError};

/// Images `[N, 1, 28, 28]` (f32, normalised) with labels `[N]` (i64).
#[derive(Debug)]
pub struct ImageSet {
    /// The images.
    pub images: Tensor,
    /// The labels.
    pub labels: Tensor,
}

impl ImageSet {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.size()[0] as usize
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The samples at `indices`, as one batch.
    pub fn batch(&self, indices: &[usize]) -> (Tensor, Tensor) {
        let index = Tensor::from_slice(&indices.iter().map(|&i| i as i64).collect::<Vec<_>>());
        (
            self.images.index_select(0, &index),
            self.labels.index_select(0, &index),
        )
    }

    /// Samples `range` of this set.
    pub fn slice(&self, start: usize, end: usize) -> ImageSet {
        let (start, end) = (start as i64, end as i64);
        ImageSet {
            images: self.images.slice(0, start, end, 1),
            labels: self.labels.slice(0, start, end, 1),
        }
    }
}

/// A training and a test set.
#[derive(Debug)]
pub struct ImageData {
    /// Train on these.
    pub train: ImageSet,
    /// Evaluate on these.
    pub test: ImageSet,
    /// Where they came from, for the user.
    pub description: String,
}

/// Bytes 0–255 as the network takes them.
fn normalise(pixels: Tensor) -> Tensor {
    super::network::standardise(pixels.to_kind(Kind::Float) / 255.0)
}

/// Reads MNIST or Fashion-MNIST from `dir`: `train-images-idx3-ubyte`,
/// `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
/// `t10k-labels-idx1-ubyte`, each optionally `.gz`. With only the `t10k`
/// files, its first 8,000 samples train and the last 2,000 test.
pub fn load_mnist(dir: &Path) -> Result<ImageData, IdxError> {
    let find = |stem: &str| {
        [stem.to_string(), format!("{stem}.gz")]
            .into_iter()
            .map(|name| dir.join(name))
            .find(|p| p.exists())
    };
    let read_set = |images: &Path, labels: &Path| -> Result<ImageSet, IdxError> {
        let (image_dims, image_bytes) = read_idx(images)?;
        let (label_dims, label_bytes) = read_idx(labels)?;
        if image_dims.len() != 3 || image_dims[1..] != [28, 28] || label_dims.len() != 1 {
            return Err(IdxError::Format {
                path: images.to_path_buf(),
                detail: format!(
                    "expected N×28×28 images and N labels, found {image_dims:?} and {label_dims:?}"
                ),
            });
        }
        if image_dims[0] != label_dims[0] {
            return Err(IdxError::Format {
                path: labels.to_path_buf(),
                detail: format!("{} images but {} labels", image_dims[0], label_dims[0]),
            });
        }
        let n = image_dims[0] as i64;
        Ok(ImageSet {
            images: normalise(Tensor::from_slice(&image_bytes).view([n, 1, 28, 28])),
            labels: Tensor::from_slice(&label_bytes).to_kind(Kind::Int64),
        })
    };
    let missing = |stem: &str| IdxError::Format {
        path: dir.join(stem),
        detail: "not found (with or without .gz)".into(),
    };
    let test_images =
        find("t10k-images-idx3-ubyte").ok_or_else(|| missing("t10k-images-idx3-ubyte"))?;
    let test_labels =
        find("t10k-labels-idx1-ubyte").ok_or_else(|| missing("t10k-labels-idx1-ubyte"))?;
    let test = read_set(&test_images, &test_labels)?;
    match (
        find("train-images-idx3-ubyte"),
        find("train-labels-idx1-ubyte"),
    ) {
        (Some(images), Some(labels)) => Ok(ImageData {
            train: read_set(&images, &labels)?,
            test,
            description: format!("MNIST-format files in {}", dir.display()),
        }),
        _ => {
            let split = test.len() * 4 / 5;
            Ok(ImageData {
                train: test.slice(0, split),
                test: test.slice(split, test.len()),
                description: format!(
                    "the t10k files in {} split {split}/{} (no train files there)",
                    dir.display(),
                    test.len() - split
                ),
            })
        }
    }
}

/// The embedded default: `train` + `test` generated digits (see
/// [`generate_digits`]), the same for a given seed on every machine.
pub fn embedded_digits(train: usize, test: usize, seed: u64) -> ImageData {
    let (images, labels) = generate_digits(train + test, seed);
    let n = (train + test) as i64;
    let all = ImageSet {
        images: normalise(Tensor::from_slice(&images).view([n, 1, 28, 28])),
        labels: Tensor::from_slice(&labels),
    };
    ImageData {
        train: all.slice(0, train),
        test: all.slice(train, train + test),
        description: format!("embedded generated digits ({train} train, {test} test, seed {seed})"),
    }
}
