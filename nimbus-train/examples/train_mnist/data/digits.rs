//! A generated, digit-like dataset: seven-segment digits 0–9 drawn with
//! anti-aliased strokes at random size, position, slant and stroke width,
//! with pixel noise, on 28×28 like MNIST. Deterministic for a seed on every
//! machine (its own generator, no dependency's), so it ships as code rather
//! than as data and still gives every run the same bytes.

/// Segment endpoints in a unit box (x right, y down): a, b, c, d, e, f, g.
const SEGMENTS: [((f32, f32), (f32, f32)); 7] = [
    ((0.0, 0.0), (1.0, 0.0)),
    ((1.0, 0.0), (1.0, 0.5)),
    ((1.0, 0.5), (1.0, 1.0)),
    ((0.0, 1.0), (1.0, 1.0)),
    ((0.0, 0.5), (0.0, 1.0)),
    ((0.0, 0.0), (0.0, 0.5)),
    ((0.0, 0.5), (1.0, 0.5)),
];

/// Which segments each digit lights, as bits a..g.
const DIGITS: [u8; 10] = [
    0b0111111, 0b0000110, 0b1011011, 0b1001111, 0b1100110, 0b1101101, 0b1111101, 0b0000111,
    0b1111111, 0b1101111,
];

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}

fn distance_to_segment(p: (f32, f32), a: (f32, f32), b: (f32, f32)) -> f32 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let length2 = dx * dx + dy * dy;
    let t = if length2 == 0.0 {
        0.0
    } else {
        (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / length2).clamp(0.0, 1.0)
    };
    let (x, y) = (a.0 + t * dx - p.0, a.1 + t * dy - p.1);
    (x * x + y * y).sqrt()
}

/// `n` images (28×28 bytes each, row-major) and their labels, label `i %
/// 10` for sample `i` (so every class is equally frequent).
pub fn generate_digits(n: usize, seed: u64) -> (Vec<u8>, Vec<i64>) {
    let mut rng = SplitMix(seed ^ 0x6e69_6d62_7573);
    let mut images = vec![0u8; n * 28 * 28];
    let mut labels = Vec::with_capacity(n);
    for (i, image) in images.chunks_mut(28 * 28).enumerate() {
        let digit = i % 10;
        labels.push(digit as i64);
        let width = rng.uniform(9.0, 15.0);
        let height = rng.uniform(16.0, 21.0);
        let left = 14.0 - width / 2.0 + rng.uniform(-3.0, 3.0);
        let top = 14.0 - height / 2.0 + rng.uniform(-2.5, 2.5);
        let slant = rng.uniform(-0.3, 0.3);
        let stroke = rng.uniform(1.0, 2.2);
        let place = |(x, y): (f32, f32)| {
            (
                left + x * width + slant * (0.5 - y) * height,
                top + y * height,
            )
        };
        let strokes: Vec<((f32, f32), (f32, f32))> = SEGMENTS
            .iter()
            .enumerate()
            .filter(|(s, _)| DIGITS[digit] & (1 << s) != 0)
            .map(|(_, &(a, b))| (place(a), place(b)))
            .collect();
        for (p, pixel) in image.iter_mut().enumerate() {
            let centre = ((p % 28) as f32 + 0.5, (p / 28) as f32 + 0.5);
            let distance = strokes
                .iter()
                .map(|&(a, b)| distance_to_segment(centre, a, b))
                .fold(f32::INFINITY, f32::min);
            let ink = (stroke + 0.5 - distance).clamp(0.0, 1.0);
            let noise = rng.uniform(0.0, 0.15);
            *pixel = ((ink * 0.9 + noise).min(1.0) * 255.0) as u8;
        }
    }
    (images, labels)
}

#[cfg(test)]
mod tests {
    // Paths, not `use super::*`: this file is also compiled into test
    // binaries without a libtest harness, where the tests are left out.
    #[test]
    fn deterministic_per_seed_and_digits_differ() {
        use super::generate_digits;
        let (a, labels) = generate_digits(20, 1);
        let (b, _) = generate_digits(20, 1);
        let (c, _) = generate_digits(20, 2);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(labels[..3], [0, 1, 2]);
        // A one lights fewer pixels than an eight.
        let ink = |k: usize| {
            a[k * 784..(k + 1) * 784]
                .iter()
                .filter(|&&p| p > 128)
                .count()
        };
        assert!(ink(1) < ink(8), "{} vs {}", ink(1), ink(8));
    }
}
