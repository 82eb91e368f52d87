//! A run's results on disk, for people and tools (Ray Train's
//! `progress.csv`/`result.json`): every `report` of rank 0 as it arrives,
//! and a plot of the losses.
//!
//! In the run directory (`RunConfig::run_dir`):
//!
//! 1. [`METRICS_FILE`]: one JSON object per report, appended and flushed as
//!    the report arrives: `index` (the report's number, continuing across
//!    restarts), `attempt` (the attempt's generation, which grows across
//!    restarts and across fits of the run: `checkpoint/fence.rs`),
//!    `time_ms` (Unix milliseconds), `epoch` when the metrics have one, and
//!    `metrics`. A restarted attempt re-reports from its checkpoint: its
//!    lines follow, with the new attempt, the same indices again.
//! 2. [`PROGRESS_FILE`]: the same rows as CSV. Its columns are fixed by its
//!    first report (`index,attempt,time_ms,` then the metric names in
//!    order); a later fit of the run appends under the same header, and
//!    metrics no column names are in the JSON lines only.
//! 3. [`PLOT_FILE`]: every metric whose name holds `loss` against the report
//!    index (the last value reported for each index), drawn at the end of
//!    the run and by `nimbus plot RUN_DIR`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One line per report.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The reports as CSV.
pub const PROGRESS_FILE: &str = "progress.csv";
/// The losses, plotted.
pub const PLOT_FILE: &str = "loss.svg";
/// The plot's size in pixels.
const PLOT_SIZE: (u32, u32) = (900, 500);

/// What can go wrong with a run's results files.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line of the metrics file is not a report.
    #[error("{path} line {line}: not a report ({detail}); the file was not written by nimbus or was cut short")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// Nothing to plot.
    #[error("{path} holds no metric named like *loss*; nothing to plot")]
    NoLoss {
        /// The metrics file.
        path: PathBuf,
    },
    /// The plot could not be drawn.
    #[error("cannot draw {path}: {detail}")]
    Plot {
        /// The plot file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

/// One report as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReportLine {
    /// The report's number (1-based, continuing across restarts).
    pub index: u64,
    /// The attempt's generation.
    pub attempt: u64,
    /// When it arrived, Unix milliseconds.
    pub time_ms: u64,
    /// `metrics["epoch"]`, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<f64>,
    /// The metrics.
    pub metrics: BTreeMap<String, f64>,
}

impl ReportLine {
    /// A report of `metrics` with number `index` in `attempt`, now.
    pub fn now(index: u64, attempt: u64, metrics: BTreeMap<String, f64>) -> Self {
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        ReportLine {
            index,
            attempt,
            time_ms,
            epoch: metrics.get("epoch").copied(),
            metrics,
        }
    }
}

/// The open results files of a run directory.
pub struct ResultsLog {
    dir: PathBuf,
    metrics: File,
    progress: File,
    /// The CSV's metric columns, once known.
    columns: Option<Vec<String>>,
}

impl ResultsLog {
    /// Opens (creating) the results files of `run_dir` for appending.
    pub fn open(run_dir: &Path) -> Result<Self, ResultsError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ResultsError::Io { path, source }
        };
        std::fs::create_dir_all(run_dir).map_err(io(run_dir))?;
        let append = |name: &str| {
            let path = run_dir.join(name);
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(io(&path))
        };
        let progress_path = run_dir.join(PROGRESS_FILE);
        let columns = match File::open(&progress_path) {
            Ok(file) => {
                let mut header = String::new();
                BufReader::new(file)
                    .read_line(&mut header)
                    .map_err(io(&progress_path))?;
                csv_columns(header.trim_end())
            }
            Err(_) => None,
        };
        Ok(ResultsLog {
            dir: run_dir.to_path_buf(),
            metrics: append(METRICS_FILE)?,
            progress: append(PROGRESS_FILE)?,
            columns,
        })
    }

    /// Appends `report` to both files and flushes them.
    pub fn append(&mut self, report: &ReportLine) -> Result<(), ResultsError> {
        let metrics_path = self.dir.join(METRICS_FILE);
        let mut line = serde_json::to_string(report).map_err(|e| ResultsError::Io {
            path: metrics_path.clone(),
            source: e.into(),
        })?;
        line.push('\n');
        self.metrics
            .write_all(line.as_bytes())
            .map_err(|source| ResultsError::Io {
                path: metrics_path,
                source,
            })?;
        let mut csv = String::new();
        let columns = match &self.columns {
            Some(columns) => columns,
            None => {
                let columns: Vec<String> = report.metrics.keys().cloned().collect();
                csv.push_str("index,attempt,time_ms");
                for column in &columns {
                    csv.push(',');
                    csv.push_str(&csv_field(column));
                }
                csv.push('\n');
                self.columns.insert(columns)
            }
        };
        csv.push_str(&format!(
            "{},{},{}",
            report.index, report.attempt, report.time_ms
        ));
        for column in columns {
            csv.push(',');
            if let Some(value) = report.metrics.get(column) {
                csv.push_str(&value.to_string());
            }
        }
        csv.push('\n');
        self.progress
            .write_all(csv.as_bytes())
            .map_err(|source| ResultsError::Io {
                path: self.dir.join(PROGRESS_FILE),
                source,
            })
    }
}

/// The metric columns of a `progress.csv` header, if it is one.
fn csv_columns(header: &str) -> Option<Vec<String>> {
    let rest = header.strip_prefix("index,attempt,time_ms")?;
    Some(
        rest.split(',')
            .skip(1)
            .map(|name| name.trim_matches('"').replace("\"\"", "\""))
            .collect(),
    )
}

/// `name` as a CSV field: quoted when it holds a comma or a quote.
fn csv_field(name: &str) -> String {
    if name.contains([',', '"', '\n']) {
        format!("\"{}\"", name.replace('"', "\"\""))
    } else {
        name.to_string()
    }
}

/// Every report in `run_dir`'s metrics file, in the order written.
pub fn read_reports(run_dir: &Path) -> Result<Vec<ReportLine>, ResultsError> {
    let path = run_dir.join(METRICS_FILE);
    let file = File::open(&path).map_err(|source| ResultsError::Io {
        path: path.clone(),
        source,
    })?;
    let mut reports = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| ResultsError::Io {
            path: path.clone(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let report = serde_json::from_str(&line).map_err(|e| ResultsError::Corrupt {
            path: path.clone(),
            line: i + 1,
            detail: e.to_string(),
        })?;
        reports.push(report);
    }
    Ok(reports)
}

/// Each loss metric's curve: (index, value) points, the last value
/// reported for each index, by index.
pub fn loss_curves(reports: &[ReportLine]) -> BTreeMap<String, Vec<(u64, f64)>> {
    let mut curves: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for report in reports {
        for (name, value) in &report.metrics {
            if name.contains("loss") && value.is_finite() {
                curves
                    .entry(name.clone())
                    .or_default()
                    .insert(report.index, *value);
            }
        }
    }
    curves
        .into_iter()
        .map(|(name, points)| (name, points.into_iter().collect()))
        .collect()
}

/// Draws `run_dir`'s losses into its [`PLOT_FILE`]; returns the file.
pub fn plot(run_dir: &Path) -> Result<PathBuf, ResultsError> {
    use plotters::prelude::*;

    let reports = read_reports(run_dir)?;
    let curves = loss_curves(&reports);
    if curves.is_empty() {
        return Err(ResultsError::NoLoss {
            path: run_dir.join(METRICS_FILE),
        });
    }
    let path = run_dir.join(PLOT_FILE);
    let failed = |e: &dyn std::fmt::Display| ResultsError::Plot {
        path: path.clone(),
        detail: e.to_string(),
    };
    let points = curves.values().flatten();
    let last = points.clone().map(|(i, _)| *i).max().unwrap_or(1).max(2);
    let (low, high) = points.fold((f64::MAX, f64::MIN), |(lo, hi), (_, v)| {
        (lo.min(*v), hi.max(*v))
    });
    let margin = ((high - low) * 0.05).max(1e-9);
    let title = run_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = SVGBackend::new(&path, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| failed(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: loss by report"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(1u64..last, (low - margin)..(high + margin))
        .map_err(|e| failed(&e))?;
    chart
        .configure_mesh()
        .x_desc("report")
        .y_desc("loss")
        .draw()
        .map_err(|e| failed(&e))?;
    for (i, (name, curve)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).mix(0.9);
        chart
            .draw_series(LineSeries::new(
                curve.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| failed(&e))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| failed(&e))?;
    root.present().map_err(|e| failed(&e))?;
    Ok(run_dir.join(PLOT_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(index: u64, attempt: u64, loss: f64) -> ReportLine {
        let metrics = BTreeMap::from([("epoch".to_string(), 1.0), ("loss".to_string(), loss)]);
        ReportLine::now(index, attempt, metrics)
    }

    #[test]
    fn reports_are_appended_across_reopenings_under_one_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ResultsLog::open(dir.path()).unwrap();
        log.append(&report(1, 0, 2.0)).unwrap();
        log.append(&report(2, 0, 1.5)).unwrap();
        drop(log);
        // A later fit resumes from report 1 and re-reports 2 with a new
        // metric the CSV has no column for.
        let mut log = ResultsLog::open(dir.path()).unwrap();
        let mut again = report(2, 1, 1.4);
        again.metrics.insert("accuracy".into(), 0.9);
        log.append(&again).unwrap();
        let reports = read_reports(dir.path()).unwrap();
        assert_eq!(reports.len(), 3);
        assert_eq!(reports[2], again);
        assert_eq!(reports[2].epoch, Some(1.0));
        let csv = std::fs::read_to_string(dir.path().join(PROGRESS_FILE)).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "index,attempt,time_ms,epoch,loss");
        assert_eq!(lines.len(), 4);
        assert!(
            lines[3].starts_with("2,1,") && lines[3].ends_with(",1,1.4"),
            "{csv}"
        );
        // The curve keeps the last value of each index.
        assert_eq!(loss_curves(&reports)["loss"], vec![(1, 2.0), (2, 1.4)]);
    }

    #[test]
    fn the_plot_is_an_svg_with_one_curve_per_loss() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = ResultsLog::open(dir.path()).unwrap();
        for i in 1..=20 {
            let mut line = report(i, 0, 1.0 / i as f64);
            line.metrics.insert("val_loss".into(), 2.0 / i as f64);
            log.append(&line).unwrap();
        }
        let path = plot(dir.path()).unwrap();
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        let curves: Vec<&str> = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains(r#"stroke-width="2""#))
            .collect();
        assert_eq!(curves.len(), 2, "{svg}");
        for curve in curves {
            let points = curve.split("points=\"").nth(1).unwrap();
            assert_eq!(
                points.matches(',').count(),
                20,
                "one point per report: {curve}"
            );
        }
        assert!(svg.contains("val_loss"));
    }

    #[test]
    fn a_broken_metrics_file_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_FILE), "{\"index\": 1}\n").unwrap();
        let error = read_reports(dir.path()).unwrap_err().to_string();
        assert!(error.contains("metrics.jsonl line 1"), "{error}");
        assert!(matches!(
            plot(dir.path()),
            Err(ResultsError::Corrupt { .. })
        ));
        std::fs::write(dir.path().join(METRICS_FILE), "").unwrap();
        assert!(matches!(plot(dir.path()), Err(ResultsError::NoLoss { .. })));
    }
}
