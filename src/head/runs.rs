//! The training runs the head knows (the dashboard's training page): each
//! run's supervisor reports what it did about once a second
//! (`JobRequest::RunEvents`); the head keeps the last [`MAX_RUNS`] runs,
//! each with its last [`MAX_POINTS`] reports, a plain bounded table.

use std::collections::VecDeque;

use crate::cluster::{bounded_text, RunEvent, RunHeader, RunNote, RunRecord};

/// Runs the head keeps (the oldest are forgotten first).
pub const MAX_RUNS: usize = 100;
/// Reports kept per run (the oldest are forgotten first).
pub const MAX_POINTS: usize = 10_000;
/// Checkpoints and timeline lines kept per run.
pub const MAX_NOTES: usize = 1_000;

/// The last [`MAX_RUNS`] runs, in the order first heard of.
#[derive(Debug, Default)]
pub struct RunTable {
    runs: VecDeque<RunRecord>,
}

impl RunTable {
    /// Applies `events` of run `header`.
    pub fn apply(&mut self, header: RunHeader, events: Vec<RunEvent>) {
        let at = match self.runs.iter().position(|r| r.header.id == header.id) {
            Some(at) => at,
            None => {
                let started_ms = events.first().map_or(0, time_ms);
                self.runs.push_back(RunRecord {
                    header: RunHeader {
                        id: bounded_text(header.id),
                        name: bounded_text(header.name),
                        dir: bounded_text(header.dir),
                        job: bounded_text(header.job),
                    },
                    state: "RUNNING".into(),
                    started_ms,
                    ended_ms: None,
                    attempts: 0,
                    reports: 0,
                    points: Vec::new(),
                    checkpoints: Vec::new(),
                    timeline: Vec::new(),
                    last: Default::default(),
                });
                while self.runs.len() > MAX_RUNS {
                    self.runs.pop_front();
                }
                self.runs.len() - 1
            }
        };
        let run = &mut self.runs[at];
        for event in events {
            apply(run, event);
        }
        bound(&mut run.points, MAX_POINTS);
        bound(&mut run.checkpoints, MAX_NOTES);
        bound(&mut run.timeline, MAX_NOTES);
    }

    /// Fails the runs of `job` still running: the job ended (`reason`) at
    /// `time_ms`, and their supervisors with it. A run whose last events
    /// arrive afterwards takes the state they say.
    pub fn end_job(&mut self, job: &str, reason: &str, time_ms: u64) {
        let running = self
            .runs
            .iter_mut()
            .filter(|r| r.header.job == job && r.state == "RUNNING");
        for run in running {
            let error = format!("its job ended before it did: {reason}");
            apply(
                run,
                RunEvent::Finished {
                    error: Some(error),
                    time_ms,
                },
            );
        }
    }

    /// Every run, oldest first, without its points.
    pub fn list(&self) -> Vec<RunRecord> {
        self.runs
            .iter()
            .map(|run| RunRecord {
                points: Vec::new(),
                ..run.clone()
            })
            .collect()
    }

    /// Run `id`, with its points.
    pub fn get(&self, id: &str) -> Option<RunRecord> {
        self.runs.iter().find(|r| r.header.id == id).cloned()
    }
}

fn time_ms(event: &RunEvent) -> u64 {
    match event {
        RunEvent::Started { time_ms, .. }
        | RunEvent::Failed { time_ms, .. }
        | RunEvent::Recovered { time_ms, .. }
        | RunEvent::Finished { time_ms, .. } => *time_ms,
        RunEvent::Reported(point) => point.time_ms,
        RunEvent::Checkpoint(_) => 0,
    }
}

fn apply(run: &mut RunRecord, event: RunEvent) {
    let mut note = |time_ms, kind: &str, text: String| {
        run.timeline.push(RunNote {
            time_ms,
            kind: kind.into(),
            text: bounded_text(text),
        })
    };
    match event {
        RunEvent::Started {
            attempt,
            workers,
            resumed_from,
            time_ms,
        } => {
            let from = resumed_from.map_or(String::new(), |c| format!(", resumed from {c}"));
            note(
                time_ms,
                "started",
                format!("attempt {attempt} with {workers} worker(s){from}"),
            );
            run.attempts = run.attempts.max(attempt + 1);
        }
        RunEvent::Reported(point) => {
            run.reports += 1;
            run.last = point.metrics.clone();
            run.points.push(point);
        }
        RunEvent::Checkpoint(mut checkpoint) => {
            checkpoint.path = bounded_text(checkpoint.path);
            run.checkpoints.push(checkpoint);
        }
        RunEvent::Failed {
            attempt,
            reason,
            time_ms,
        } => note(
            time_ms,
            "failed",
            format!("attempt {attempt} failed: {reason}"),
        ),
        RunEvent::Recovered {
            index,
            took_ms,
            time_ms,
        } => note(
            time_ms,
            "recovered",
            format!(
                "report {index} done {:.1} s after the failure",
                took_ms as f64 / 1000.0
            ),
        ),
        RunEvent::Finished { error, time_ms } => {
            let text = match &error {
                None => "finished".to_string(),
                Some(error) => format!("failed: {error}"),
            };
            note(time_ms, "finished", text);
            run.state = if error.is_none() {
                "FINISHED"
            } else {
                "FAILED"
            }
            .into();
            run.ended_ms = Some(time_ms);
        }
    }
}

/// Keeps the last `max` of `items`.
fn bound<T>(items: &mut Vec<T>, max: usize) {
    if items.len() > max {
        items.drain(..items.len() - max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{RunCheckpoint, RunPoint};

    fn header(id: &str) -> RunHeader {
        RunHeader {
            id: id.into(),
            name: "mnist".into(),
            dir: "/runs/mnist".into(),
            job: "j".into(),
        }
    }

    fn point(index: u64, attempt: u64) -> RunEvent {
        RunEvent::Reported(RunPoint {
            index,
            attempt,
            time_ms: index,
            metrics: [("loss".to_string(), 1.0 / index as f64)].into(),
        })
    }

    #[test]
    fn a_run_with_a_restart_is_kept_in_order() {
        let mut table = RunTable::default();
        let started = |attempt| RunEvent::Started {
            attempt,
            workers: 2,
            resumed_from: None,
            time_ms: 1,
        };
        table.apply(header("a"), vec![started(0), point(1, 0), point(2, 0)]);
        table.apply(
            header("a"),
            vec![
                RunEvent::Failed {
                    attempt: 0,
                    reason: "killed by signal 9".into(),
                    time_ms: 3,
                },
                started(1),
                point(2, 1),
                RunEvent::Recovered {
                    index: 2,
                    took_ms: 1500,
                    time_ms: 4,
                },
                RunEvent::Checkpoint(RunCheckpoint {
                    index: 2,
                    path: "/runs/mnist/checkpoint_000000002".into(),
                    metrics: Default::default(),
                }),
                RunEvent::Finished {
                    error: None,
                    time_ms: 5,
                },
            ],
        );
        let run = table.get("a").unwrap();
        assert_eq!(
            (run.state.as_str(), run.attempts, run.reports),
            ("FINISHED", 2, 3)
        );
        assert_eq!(run.points.len(), 3);
        assert_eq!(run.checkpoints.len(), 1);
        let kinds: Vec<&str> = run.timeline.iter().map(|n| n.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["started", "failed", "started", "recovered", "finished"]
        );
        assert!(
            table.list()[0].points.is_empty(),
            "listings leave the points out"
        );
        assert_eq!(table.list()[0].last["loss"], 0.5);
    }

    #[test]
    fn a_runs_job_ending_fails_it_if_it_still_runs() {
        let mut table = RunTable::default();
        table.apply(header("a"), vec![point(1, 0)]);
        table.apply(header("b"), vec![point(1, 0)]);
        table.apply(
            header("b"),
            vec![RunEvent::Finished {
                error: None,
                time_ms: 5,
            }],
        );
        table.end_job(&header("a").job, "stopped on request", 9);
        let a = table.get("a").unwrap();
        assert_eq!((a.state.as_str(), a.ended_ms), ("FAILED", Some(9)));
        assert_eq!(
            a.timeline.last().unwrap().text,
            "failed: its job ended before it did: stopped on request"
        );
        assert_eq!(table.get("b").unwrap().state, "FINISHED");
    }

    #[test]
    fn runs_and_points_are_bounded() {
        let mut table = RunTable::default();
        for i in 0..MAX_RUNS + 5 {
            table.apply(header(&format!("r{i}")), vec![point(1, 0)]);
        }
        assert_eq!(table.list().len(), MAX_RUNS);
        assert!(table.get("r0").is_none(), "the oldest are forgotten");
        let many: Vec<RunEvent> = (1..=MAX_POINTS as u64 + 10).map(|i| point(i, 0)).collect();
        table.apply(header("big"), many);
        let big = table.get("big").unwrap();
        assert_eq!(big.points.len(), MAX_POINTS);
        assert_eq!(big.reports, MAX_POINTS as u64 + 10);
        assert_eq!(big.points[0].index, 11);
    }
}
