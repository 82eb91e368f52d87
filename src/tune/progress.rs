//! The progress table the tuner shows on standard error while an
//! experiment runs.

use std::time::Duration;

use super::config::TuneConfig;
use super::experiment::{TrialRecord, TrialStatus};

/// Rows shown at most in the progress table (running trials first, then
/// the best).
const PROGRESS_ROWS: usize = 12;

/// The progress table: trials by status, then a row per running trial and
/// the best ones so far (trial, status, iterations, latest metric,
/// config).
pub(crate) fn progress_table(
    trials: &[TrialRecord],
    config: &TuneConfig,
    elapsed: Duration,
) -> String {
    let count = |status: TrialStatus| trials.iter().filter(|t| t.status == status).count();
    let mut out = format!(
        "== tune: {} trials after {:.0?}: {} running, {} pending, {} terminated, {} error ==\n",
        trials.len(),
        elapsed,
        count(TrialStatus::Running),
        count(TrialStatus::Pending),
        count(TrialStatus::Terminated),
        count(TrialStatus::Error),
    );
    let latest = |t: &TrialRecord| t.last.as_ref().and_then(|l| l.get(&config.metric)).copied();
    let mut shown: Vec<&TrialRecord> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Running)
        .collect();
    let mut ended: Vec<&TrialRecord> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Terminated && latest(t).is_some())
        .collect();
    ended.sort_by(|a, b| {
        let score = |t: &TrialRecord| config.mode.score(latest(t).unwrap_or(f64::NAN));
        score(b).total_cmp(&score(a))
    });
    shown.extend(ended);
    out.push_str(&format!(
        "{:>6}  {:<10} {:>5}  {:>12}  config\n",
        "trial", "status", "iter", config.metric
    ));
    for t in shown.into_iter().take(PROGRESS_ROWS) {
        let value = latest(t).map_or_else(|| "-".to_string(), |v| format!("{v:.6}"));
        out.push_str(&format!(
            "{:>6}  {:<10} {:>5}  {:>12}  {}\n",
            t.id,
            format!("{:?}", t.status),
            t.iterations,
            value,
            serde_json::Value::Object(t.config.clone())
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::config::Mode;
    use crate::tune::search::TrialConfig;

    #[test]
    fn the_progress_table_counts_trials_and_shows_running_then_best() {
        let dir = std::path::Path::new("/x");
        let trial = |id: u64, status: TrialStatus, loss: Option<f64>| {
            let mut config = TrialConfig::new();
            config.insert("lr".into(), serde_json::json!(id));
            let mut t = TrialRecord::new(id, config, dir);
            t.status = status;
            t.last = loss.map(|l| [("loss".to_string(), l)].into());
            t.iterations = 3;
            t
        };
        let trials = [
            trial(0, TrialStatus::Terminated, Some(0.5)),
            trial(1, TrialStatus::Terminated, Some(0.1)),
            trial(2, TrialStatus::Running, Some(0.9)),
            trial(3, TrialStatus::Pending, None),
            trial(4, TrialStatus::Error, None),
        ];
        let config = TuneConfig::new("loss", Mode::Min);
        let table = progress_table(&trials, &config, Duration::from_secs(7));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "== tune: 5 trials after 7s: 1 running, 1 pending, 2 terminated, 1 error =="
        );
        let ids: Vec<&str> = lines[2..]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(ids, ["2", "1", "0"], "running, then best first:\n{table}");
        assert!(
            lines[3].contains("0.100000") && lines[3].ends_with("{\"lr\":1}"),
            "{table}"
        );
    }
}
