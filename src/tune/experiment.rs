//! An experiment's records and files.
//!
//! The experiment directory (`storage_path/<name>/`, created `0700`):
//! - `experiment_state.json` ([`STATE_FILE`]): every trial's record, written
//!   (to a temporary file, then renamed over the old one) as trials start,
//!   end or are retried (see `tuner/`); `Tuner::restore` reads it;
//! - `.experiment.lock` ([`LOCK_FILE`]): locked by the tuner running it;
//! - `trial_<n>/params.json` (`trial_00003`: n zero-padded): the trial's
//!   config, written before it starts;
//! - `trial_<n>/result.jsonl` ([`RESULT_FILE`]): one line per result, as it
//!   arrives (`trial`, `attempt`, `iteration`, `time_ms`, `metrics`);
//! - `trial_<n>/progress.csv`: the same as a table, one column per metric
//!   of the first result;
//! - `trial_<n>/checkpoint_<iteration>/` (zero-padded too): its checkpoints
//!   (`checkpoint.rs`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::checkpoint::{directory_name, TrialCheckpoint};
use super::config::Mode;
use super::search::TrialConfig;
use super::trial::Metrics;
use super::TuneError;
use crate::library::files::{lock_exclusive, private_dir, private_file, private_log, sync_dir};

/// The experiment's state file.
pub const STATE_FILE: &str = "experiment_state.json";
/// A trial's results, one JSON line each.
pub const RESULT_FILE: &str = "result.jsonl";
/// Locked (`flock`) by the tuner running the experiment.
pub const LOCK_FILE: &str = ".experiment.lock";

/// Where a trial stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrialStatus {
    /// Waiting for a runner.
    Pending,
    /// On a runner.
    Running,
    /// Ended: it returned, or was stopped (early, by a criterion, or by
    /// the time budget).
    Terminated,
    /// Failed more often than `max_failures` allows, or timed out.
    Error,
}

/// One trial: its config, where it stands and what it reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// Its number, from 0.
    pub id: u64,
    /// Its config.
    pub config: TrialConfig,
    /// Where it stands.
    pub status: TrialStatus,
    /// Results reported, counting those before the checkpoint its last
    /// run started from.
    pub iterations: u64,
    /// Its last result.
    #[serde(deserialize_with = "nan_metrics::option")]
    pub last: Option<Metrics>,
    /// Its best result by the experiment's metric and mode.
    #[serde(deserialize_with = "nan_metrics::option")]
    pub best: Option<Metrics>,
    /// Failures so far (each retried, from its latest checkpoint or the
    /// start, while within `max_failures`).
    pub failures: u32,
    /// Runs started: the first, then one more per retry, exploit or
    /// restore.
    #[serde(default)]
    pub runs: u32,
    /// Why it failed, for `Error`.
    pub error: Option<String>,
    /// The scheduler stopped it before its end.
    pub stopped_early: bool,
    /// Its latest checkpoint: where a retry or a restored experiment
    /// resumes it.
    pub checkpoint: Option<TrialCheckpoint>,
    /// PBT exploits it made, in order.
    #[serde(default)]
    pub exploits: Vec<ExploitRecord>,
    /// Its directory.
    pub dir: PathBuf,
}

impl TrialRecord {
    /// The record of a new trial.
    pub(crate) fn new(id: u64, config: TrialConfig, experiment: &Path) -> Self {
        TrialRecord {
            id,
            config,
            status: TrialStatus::Pending,
            iterations: 0,
            last: None,
            best: None,
            failures: 0,
            runs: 0,
            error: None,
            stopped_early: false,
            checkpoint: None,
            exploits: Vec::new(),
            dir: trial_dir(experiment, id),
        }
    }
}

/// A PBT exploit: at `iteration`, the trial went on from trial `from`'s
/// checkpoint of `from_iteration` with `config`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExploitRecord {
    /// The trial's iteration when it exploited.
    pub iteration: u64,
    /// The better trial.
    pub from: u64,
    /// The iteration of `from`'s checkpoint it went on from.
    pub from_iteration: u64,
    /// Its config from then on.
    pub config: TrialConfig,
}

/// Trial `id`'s directory in `experiment`.
fn trial_dir(experiment: &Path, id: u64) -> PathBuf {
    experiment.join(format!("trial_{id:05}"))
}

/// What an experiment ran: every trial's record.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ResultGrid {
    /// The experiment directory.
    pub path: PathBuf,
    /// The metric it optimised.
    pub metric: String,
    /// Whether higher or lower is better.
    pub mode: Mode,
    /// The trials, by number.
    pub trials: Vec<TrialRecord>,
    /// Wall time of the experiment, in seconds.
    pub seconds: f64,
}

impl ResultGrid {
    /// The trial whose last result is best by the experiment's metric and
    /// mode (Ray's `get_best_result(scope="last")`).
    pub fn best_result(&self) -> Option<&TrialRecord> {
        self.best_by(&self.metric, self.mode)
    }

    /// The trial whose last result is best by `metric` in `mode`.
    pub fn best_by(&self, metric: &str, mode: Mode) -> Option<&TrialRecord> {
        self.trials
            .iter()
            .filter_map(|t| Some((t, *t.last.as_ref()?.get(metric)?)))
            .filter(|(_, v)| !v.is_nan())
            .max_by(|(_, a), (_, b)| mode.score(*a).total_cmp(&mode.score(*b)))
            .map(|(t, _)| t)
    }

    /// Trials that ended in error.
    pub fn errors(&self) -> impl Iterator<Item = &TrialRecord> {
        self.trials
            .iter()
            .filter(|t| t.status == TrialStatus::Error)
    }

    /// The grid as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// One row per trial: id, status, iterations, stopped early, error,
    /// each config parameter (`config/<name>`, JSON) and each metric of the
    /// last result (`<name>`).
    pub fn to_csv(&self) -> String {
        let mut params: Vec<&String> = self.trials.iter().flat_map(|t| t.config.keys()).collect();
        params.sort();
        params.dedup();
        let mut metrics: Vec<&String> = self
            .trials
            .iter()
            .flat_map(|t| t.last.iter().flat_map(|m| m.keys()))
            .collect();
        metrics.sort();
        metrics.dedup();
        let mut header = vec![
            "trial".to_string(),
            "status".into(),
            "iterations".into(),
            "stopped_early".into(),
            "error".into(),
        ];
        header.extend(params.iter().map(|p| format!("config/{p}")));
        header.extend(metrics.iter().map(|m| m.to_string()));
        let mut out = csv_line(&header);
        for t in &self.trials {
            let mut row = vec![
                t.id.to_string(),
                format!("{:?}", t.status),
                t.iterations.to_string(),
                t.stopped_early.to_string(),
                t.error.clone().unwrap_or_default(),
            ];
            row.extend(
                params
                    .iter()
                    .map(|p| t.config.get(*p).map(|v| v.to_string()).unwrap_or_default()),
            );
            row.extend(metrics.iter().map(|m| {
                t.last
                    .as_ref()
                    .and_then(|l| l.get(*m))
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            }));
            out.push_str(&csv_line(&row));
        }
        out
    }
}

/// Cuts a torn last line (its writer died mid-line) off `path`, so that
/// the next line starts on a line of its own.
fn end_at_last_line(path: &Path) -> Result<(), TuneError> {
    let Ok(bytes) = std::fs::read(path) else {
        return Ok(());
    };
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(());
    }
    let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(keep as u64))
        .map_err(io(path, "cannot cut a torn last line off"))
}

/// Replaces `path` (in `dir`) by a file of `bytes`: a temporary file,
/// fsynced, renamed over it, and the directory fsynced, so that a crash
/// leaves the old file or the new one.
fn replace_durably(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), TuneError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let temporary = dir.join(format!(".{name}.tmp"));
    let mut file = private_file(&temporary).map_err(io(&temporary, "cannot create"))?;
    file.write_all(bytes)
        .map_err(io(&temporary, "cannot write"))?;
    file.sync_all().map_err(io(&temporary, "cannot fsync"))?;
    std::fs::rename(&temporary, path).map_err(io(path, "cannot replace"))?;
    sync_dir(dir).map_err(io(dir, "cannot fsync"))
}

/// A CSV line, fields quoted where they need it.
fn csv_line(fields: &[String]) -> String {
    let quoted: Vec<String> = fields
        .iter()
        .map(|f| {
            if f.contains([',', '"', '\n']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect();
    format!("{}\n", quoted.join(","))
}

/// One line of a trial's `result.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultLine {
    /// The trial.
    pub trial: u64,
    /// Its run: 0 for the first, one more per retry, exploit or restore
    /// (`TrialRecord::runs` − 1).
    pub attempt: u32,
    /// The result's number, from 1 (an attempt resumed from a checkpoint
    /// goes on from that checkpoint's).
    pub iteration: u64,
    /// When it arrived, Unix milliseconds.
    pub time_ms: u64,
    /// What was reported.
    #[serde(deserialize_with = "nan_metrics::plain")]
    pub metrics: Metrics,
    /// The checkpoint saved with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<PathBuf>,
}

/// JSON has no NaN or infinity: `serde_json` writes them as `null`, read
/// back here as NaN (a diverged trial's loss is still a result).
mod nan_metrics {
    use super::Metrics;
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    pub(super) fn plain<'de, D: Deserializer<'de>>(d: D) -> Result<Metrics, D::Error> {
        let raw: BTreeMap<String, Option<f64>> = BTreeMap::deserialize(d)?;
        Ok(raw
            .into_iter()
            .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
            .collect())
    }

    pub(super) fn option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Metrics>, D::Error> {
        let raw: Option<BTreeMap<String, Option<f64>>> = Option::deserialize(d)?;
        Ok(raw.map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
                .collect()
        }))
    }
}

/// The experiment directory's files; see the module docs.
pub(crate) struct ExperimentFiles {
    dir: PathBuf,
    /// [`LOCK_FILE`], locked while the experiment runs.
    _lock: File,
    /// Per running trial: its `result.jsonl`, `progress.csv` and columns.
    open: HashMap<u64, (File, File, Vec<String>)>,
}

/// Takes the experiment directory's lock, refused while another process
/// (another tuner on it) holds it; released when the file
/// closes, also when the process dies.
fn lock(dir: &Path) -> Result<File, TuneError> {
    let path = dir.join(LOCK_FILE);
    let file = private_log(&path).map_err(io(&path, "cannot open"))?;
    match lock_exclusive(&file) {
        Ok(()) => Ok(file),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            Err(TuneError::ExperimentInUse(dir.to_path_buf()))
        }
        Err(e) => Err(io(&path, "cannot lock")(e)),
    }
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> TuneError + 'a {
    move |source| TuneError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

impl ExperimentFiles {
    /// Creates the experiment directory, refusing one that holds an
    /// experiment already.
    pub(crate) fn create(dir: PathBuf) -> Result<Self, TuneError> {
        if dir.join(STATE_FILE).exists() {
            return Err(TuneError::ExperimentExists(dir));
        }
        private_dir(&dir).map_err(io(&dir, "cannot create"))?;
        let lock = lock(&dir)?;
        if dir.join(STATE_FILE).exists() {
            return Err(TuneError::ExperimentExists(dir));
        }
        Ok(ExperimentFiles {
            dir,
            _lock: lock,
            open: HashMap::new(),
        })
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of an experiment to resume.
    pub(crate) fn open(dir: PathBuf) -> Result<Self, TuneError> {
        if !dir.join(STATE_FILE).is_file() {
            return Err(TuneError::NoExperiment(dir));
        }
        let lock = lock(&dir)?;
        Ok(ExperimentFiles {
            dir,
            _lock: lock,
            open: HashMap::new(),
        })
    }

    /// The trials `experiment_state.json` records.
    pub(crate) fn read_state(&self) -> Result<Vec<TrialRecord>, TuneError> {
        let path = self.dir.join(STATE_FILE);
        let bytes = std::fs::read(&path).map_err(io(&path, "cannot read"))?;
        let mut trials: Vec<TrialRecord> =
            serde_json::from_slice(&bytes).map_err(|e| TuneError::BadState {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        for (i, trial) in trials.iter_mut().enumerate() {
            if trial.id != i as u64 {
                return Err(TuneError::BadState {
                    path,
                    detail: format!("trial record {i} is numbered {}", trial.id),
                });
            }
            // Where the experiment is now (it may have been moved).
            trial.dir = trial_dir(&self.dir, trial.id);
            if let Some(checkpoint) = &mut trial.checkpoint {
                checkpoint.path = trial.dir.join(directory_name(checkpoint.iteration));
            }
        }
        Ok(trials)
    }

    /// Trials started after `experiment_state.json` was last written:
    /// their directories and `params.json` (written before a trial starts)
    /// from number `next` on, as running.
    pub(crate) fn read_unrecorded(&self, mut next: u64) -> Vec<TrialRecord> {
        let mut found = Vec::new();
        loop {
            let dir = trial_dir(&self.dir, next);
            let params = std::fs::read(dir.join("params.json")).ok();
            let Some(config) = params.and_then(|p| serde_json::from_slice(&p).ok()) else {
                return found;
            };
            let mut trial = TrialRecord::new(next, config, &self.dir);
            trial.status = TrialStatus::Running;
            found.push(trial);
            next += 1;
        }
    }

    /// The results a trial's `result.jsonl` holds (none without one); a
    /// torn last line (the writer died mid-line) is skipped.
    pub(crate) fn read_results(&self, trial: &Path) -> Result<Vec<ResultLine>, TuneError> {
        let path = trial.join(RESULT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, "cannot read")(e)),
        };
        let lines: Vec<&str> = text.lines().collect();
        let mut results = Vec::new();
        for (n, line) in lines.iter().enumerate() {
            match serde_json::from_str(line) {
                Ok(result) => results.push(result),
                Err(_) if n + 1 == lines.len() && !text.ends_with('\n') => {}
                Err(e) => {
                    return Err(TuneError::BadState {
                        path,
                        detail: format!("line {}: {e}", n + 1),
                    })
                }
            }
        }
        Ok(results)
    }

    /// A trial starts (again): its directory and `params.json`.
    pub(crate) fn trial_started(&mut self, trial: &TrialRecord) -> Result<(), TuneError> {
        private_dir(&trial.dir).map_err(io(&trial.dir, "cannot create"))?;
        let params = trial.dir.join("params.json");
        let json = serde_json::to_vec_pretty(&trial.config).unwrap_or_default();
        replace_durably(&trial.dir, &params, &json)?;
        self.open.remove(&trial.id);
        Ok(())
    }

    /// Appends a result to the trial's `result.jsonl` and `progress.csv`.
    pub(crate) fn result(&mut self, trial: &Path, line: &ResultLine) -> Result<(), TuneError> {
        let (jsonl, csv, columns) = match self.open.entry(line.trial) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let results = trial.join(RESULT_FILE);
                end_at_last_line(&results)?;
                let jsonl = private_log(&results).map_err(io(&results, "cannot open"))?;
                let progress = trial.join("progress.csv");
                end_at_last_line(&progress)?;
                // An earlier run's header stays the table's.
                let header = std::fs::read_to_string(&progress)
                    .ok()
                    .and_then(|t| t.lines().next().map(str::to_string));
                let mut csv = private_log(&progress).map_err(io(&progress, "cannot open"))?;
                let columns: Vec<String> = match &header {
                    Some(header) => header.split(',').skip(3).map(str::to_string).collect(),
                    None => line.metrics.keys().cloned().collect(),
                };
                if header.is_none() {
                    let mut header =
                        vec!["attempt".to_string(), "iteration".into(), "time_ms".into()];
                    header.extend(columns.iter().cloned());
                    csv.write_all(csv_line(&header).as_bytes())
                        .map_err(io(&progress, "cannot write"))?;
                }
                e.insert((jsonl, csv, columns))
            }
        };
        let mut json = serde_json::to_vec(line).unwrap_or_default();
        json.push(b'\n');
        let path = trial.join(RESULT_FILE);
        jsonl.write_all(&json).map_err(io(&path, "cannot write"))?;
        let mut row = vec![
            line.attempt.to_string(),
            line.iteration.to_string(),
            line.time_ms.to_string(),
        ];
        row.extend(columns.iter().map(|c| {
            line.metrics
                .get(c)
                .map(|v| v.to_string())
                .unwrap_or_default()
        }));
        let path = trial.join("progress.csv");
        csv.write_all(csv_line(&row).as_bytes())
            .map_err(io(&path, "cannot write"))
    }

    /// A trial ended: its files are closed.
    pub(crate) fn trial_ended(&mut self, trial: u64) {
        self.open.remove(&trial);
    }

    /// Writes `experiment_state.json` (temporary file, then rename).
    pub(crate) fn write_state(&self, trials: &[TrialRecord]) -> Result<(), TuneError> {
        let json = serde_json::to_vec_pretty(trials).unwrap_or_default();
        replace_durably(&self.dir, &self.dir.join(STATE_FILE), &json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(id: u64, loss: Option<f64>, status: TrialStatus) -> TrialRecord {
        let mut t = TrialRecord::new(id, TrialConfig::new(), Path::new("/x"));
        t.config
            .insert("lr".into(), serde_json::json!(0.1 * id as f64));
        t.last = loss.map(|l| Metrics::from([("loss".into(), l)]));
        t.status = status;
        t
    }

    #[test]
    fn the_best_trial_by_mode_and_the_csv() {
        let grid = ResultGrid {
            path: "/x".into(),
            metric: "loss".into(),
            mode: Mode::Min,
            trials: vec![
                trial(0, Some(0.5), TrialStatus::Terminated),
                trial(1, Some(0.2), TrialStatus::Terminated),
                trial(2, None, TrialStatus::Error),
                trial(3, Some(f64::NAN), TrialStatus::Terminated),
            ],
            seconds: 1.0,
        };
        assert_eq!(grid.best_result().unwrap().id, 1);
        assert_eq!(grid.best_by("loss", Mode::Max).unwrap().id, 0);
        assert_eq!(grid.best_by("accuracy", Mode::Max), None);
        assert_eq!(grid.errors().map(|t| t.id).collect::<Vec<_>>(), [2]);
        let csv = grid.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "trial,status,iterations,stopped_early,error,config/lr,loss"
        );
        assert_eq!(lines[2], "1,Terminated,0,false,,0.1,0.2");
        assert_eq!(lines[3], "2,Error,0,false,,0.2,");
        let back: serde_json::Value = serde_json::from_str(&grid.to_json()).unwrap();
        assert_eq!(back["trials"][1]["config"]["lr"], 0.1);
    }
}
