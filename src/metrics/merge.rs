//! The metrics of a node's worker and driver processes, summed: each
//! process pushes its whole Prometheus text every `PUSH_INTERVAL`; the node
//! keeps the latest text of each and serves the sum (a plain state
//! machine, time passed in).
//!
//! Summing is right for what processes record: counters and histograms
//! (buckets, sums and counts are cumulative) and gauges of amounts. A
//! process silent for [`RETIRE_AFTER`] has ended: its counters and
//! histograms stay in the sum (counters never go back), its gauges leave it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A process that has not pushed for this long is retired.
pub const RETIRE_AFTER: Duration = Duration::from_secs(15);
/// The most processes one node keeps metrics of.
pub(super) const MAX_PROCESSES: usize = 10_000;
/// The longest text one push may carry.
pub const MAX_PUSH_BYTES: usize = 1 << 20;

/// One family: its type and help lines, and its samples by series.
#[derive(Clone, Debug, Default, PartialEq)]
struct Family {
    /// `counter`, `gauge`, `histogram`, ...
    kind: String,
    help: Option<String>,
    /// Series (`name{labels}`) to value, in first-seen order.
    series: Vec<(String, f64)>,
}

/// Parsed text: families in first-seen order.
#[derive(Clone, Debug, Default, PartialEq)]
struct Exposition {
    families: Vec<(String, Family)>,
}

impl Exposition {
    fn family(&mut self, name: &str) -> &mut Family {
        let at = match self.families.iter().position(|(n, _)| n == name) {
            Some(at) => at,
            None => {
                self.families.push((name.to_string(), Family::default()));
                self.families.len() - 1
            }
        };
        &mut self.families[at].1
    }

    /// Adds `other`'s samples (of every family, or of the non-gauge ones
    /// only).
    fn add(&mut self, other: &Exposition, gauges: bool) {
        for (name, family) in &other.families {
            if !gauges && family.kind == "gauge" {
                continue;
            }
            let mine = self.family(name);
            if mine.kind.is_empty() {
                mine.kind = family.kind.clone();
            }
            if mine.help.is_none() {
                mine.help = family.help.clone();
            }
            for (series, value) in &family.series {
                match mine.series.iter_mut().find(|(s, _)| s == series) {
                    Some((_, sum)) => *sum += value,
                    None => mine.series.push((series.clone(), *value)),
                }
            }
        }
    }
}

/// Why a push was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PushError {
    /// Over [`MAX_PUSH_BYTES`].
    #[error("a metrics push of {0} bytes is over the limit of {MAX_PUSH_BYTES}")]
    TooLarge(usize),
    /// A line is not Prometheus text.
    #[error("metrics push line {line}: {text:?} is not a Prometheus sample")]
    NotPrometheus {
        /// The 1-based line.
        line: usize,
        /// The line (cut to 100 characters).
        text: String,
    },
    /// 10,000 processes are pushing already.
    #[error("this node keeps the metrics of {MAX_PROCESSES} processes already")]
    TooMany,
}

/// Parses the Prometheus text format as metrics exporters write it: `#
/// TYPE` and `# HELP` lines, and `series value` samples.
fn parse(text: &str) -> Result<Exposition, PushError> {
    let mut exposition = Exposition::default();
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = || PushError::NotPrometheus {
            line: i + 1,
            text: line.chars().take(100).collect(),
        };
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').ok_or_else(bad)?;
            current = name.to_string();
            exposition.family(name).kind = kind.trim().to_string();
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            exposition.family(name).help = Some(help.to_string());
        } else if line.starts_with('#') {
            continue;
        } else {
            let (series, value) = line.rsplit_once(' ').ok_or_else(bad)?;
            let value: f64 = value.parse().map_err(|_| bad())?;
            let name = series.split('{').next().unwrap_or(series);
            let family = if current.is_empty() || !name.starts_with(current.as_str()) {
                name.to_string()
            } else {
                current.clone()
            };
            exposition
                .family(&family)
                .series
                .push((series.to_string(), value));
        }
    }
    Ok(exposition)
}

/// Writes `exposition` as Prometheus text.
fn render(exposition: &Exposition, out: &mut String) {
    for (name, family) in &exposition.families {
        if let Some(help) = &family.help {
            out.push_str(&format!("# HELP {name} {help}\n"));
        }
        if !family.kind.is_empty() {
            out.push_str(&format!("# TYPE {name} {}\n", family.kind));
        }
        for (series, value) in &family.series {
            out.push_str(&format!("{series} {value}\n"));
        }
        out.push('\n');
    }
}

/// The pushed metrics of a node's processes.
#[derive(Default)]
pub struct ProcessMetrics {
    /// Process to its latest push and when it came.
    live: HashMap<String, (Instant, Exposition)>,
    /// The counters and histograms of retired processes.
    retired: Exposition,
}

impl ProcessMetrics {
    /// Keeps `text` as `process`'s latest metrics.
    pub fn push(&mut self, process: &str, text: &str, now: Instant) -> Result<(), PushError> {
        if text.len() > MAX_PUSH_BYTES {
            return Err(PushError::TooLarge(text.len()));
        }
        let exposition = parse(text)?;
        // Its own earlier push is replaced, never retired: its counters
        // are cumulative.
        if let Some(kept) = self.live.get_mut(process) {
            *kept = (now, exposition);
            self.retire(now);
            return Ok(());
        }
        self.retire(now);
        if self.live.len() >= MAX_PROCESSES {
            return Err(PushError::TooMany);
        }
        self.live.insert(process.to_string(), (now, exposition));
        Ok(())
    }

    /// Moves processes silent for [`RETIRE_AFTER`] into the retired sum.
    fn retire(&mut self, now: Instant) {
        let silent: Vec<String> = self
            .live
            .iter()
            .filter(|(_, (at, _))| now.saturating_duration_since(*at) >= RETIRE_AFTER)
            .map(|(process, _)| process.clone())
            .collect();
        for process in silent {
            if let Some((_, exposition)) = self.live.remove(&process) {
                self.retired.add(&exposition, false);
            }
        }
    }

    /// Processes pushing now.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// The sum of the node's own metrics (`own`, Prometheus text) and
    /// every process's, as Prometheus text appended to `out`.
    pub fn render(&mut self, own: &str, now: Instant, out: &mut String) {
        self.retire(now);
        let mut sum = self.retired.clone();
        match parse(own) {
            Ok(own) => sum.add(&own, true),
            Err(e) => tracing::warn!("this process's own metrics do not parse: {e}"),
        }
        let mut processes: BTreeMap<&String, &Exposition> = BTreeMap::new();
        for (process, (_, exposition)) in &self.live {
            processes.insert(process, exposition);
        }
        for exposition in processes.values() {
            sum.add(exposition, true);
        }
        render(&sum, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKER: &str = "# TYPE calls_total counter\ncalls_total{outcome=\"ok\"} 3\n\n# TYPE inflight gauge\ninflight 2\n\n# HELP latency_seconds Call latency.\n# TYPE latency_seconds histogram\nlatency_seconds_bucket{le=\"0.1\"} 1\nlatency_seconds_bucket{le=\"+Inf\"} 3\nlatency_seconds_sum 0.5\nlatency_seconds_count 3\n";

    fn rendered(metrics: &mut ProcessMetrics, now: Instant) -> String {
        let mut out = String::new();
        metrics.render(
            "# TYPE calls_total counter\ncalls_total{outcome=\"ok\"} 0\n",
            now,
            &mut out,
        );
        out
    }

    #[test]
    fn pushes_are_summed_and_retired_processes_keep_their_counters_only() {
        let start = Instant::now();
        let mut metrics = ProcessMetrics::default();
        metrics.push("worker-a", WORKER, start).unwrap();
        metrics.push("worker-b", WORKER, start).unwrap();
        // A later push replaces the earlier one.
        metrics
            .push("worker-b", &WORKER.replace("} 3\n", "} 5\n"), start)
            .unwrap();
        let out = rendered(&mut metrics, start);
        assert!(out.contains("calls_total{outcome=\"ok\"} 8\n"), "{out}");
        assert!(out.contains("inflight 4\n"), "{out}");
        assert!(
            out.contains("latency_seconds_bucket{le=\"+Inf\"} 8\n"),
            "{out}"
        );
        assert!(out.contains("latency_seconds_sum 1\n"), "{out}");
        assert!(
            out.contains(
                "# HELP latency_seconds Call latency.\n# TYPE latency_seconds histogram\n"
            ),
            "{out}"
        );
        assert_eq!(
            out.matches("# TYPE").count(),
            3,
            "one block per family: {out}"
        );
        // worker-a stops pushing; worker-b goes on.
        let later = start + RETIRE_AFTER;
        metrics
            .push("worker-b", &WORKER.replace("} 3\n", "} 6\n"), later)
            .unwrap();
        let out = rendered(&mut metrics, later);
        assert_eq!(metrics.live(), 1);
        assert!(
            out.contains("calls_total{outcome=\"ok\"} 9\n"),
            "a counter never goes back: {out}"
        );
        assert!(
            out.contains("inflight 2\n"),
            "a retired gauge leaves: {out}"
        );
    }

    #[test]
    fn bad_pushes_are_refused_with_the_line() {
        let mut metrics = ProcessMetrics::default();
        let now = Instant::now();
        let error = metrics
            .push("w", "# TYPE x counter\nx{a=\"1\"} lots\n", now)
            .unwrap_err();
        assert_eq!(
            error,
            PushError::NotPrometheus {
                line: 2,
                text: "x{a=\"1\"} lots".into()
            }
        );
        let huge = "x 1\n".repeat(MAX_PUSH_BYTES);
        assert!(matches!(
            metrics.push("w", &huge, now),
            Err(PushError::TooLarge(_))
        ));
        assert_eq!(metrics.live(), 0);
    }

    #[test]
    fn the_number_of_processes_is_bounded() {
        let mut metrics = ProcessMetrics::default();
        let now = Instant::now();
        for i in 0..MAX_PROCESSES {
            metrics.push(&format!("w{i}"), "x 1\n", now).unwrap();
        }
        assert_eq!(
            metrics.push("one-more", "x 1\n", now),
            Err(PushError::TooMany)
        );
        metrics.push("w0", "x 2\n", now).unwrap();
    }
}
