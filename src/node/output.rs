//! What workers print to stdout and write to stderr, kept per job for the
//! job's driver to read (`ReadOutput`; the driver shows it,
//! `log_to_driver`): a plain buffer.
//!
//! 1. Each line a worker prints (all but its protocol lines) is appended
//!    to its `.out` log (`workers.rs`) and pushed here under its actor's
//!    job, as are the new lines of its `.err` log every 500 ms (`logs.rs`),
//!    numbered in order within the job (from 1), cut to 4 KiB.
//! 2. A job keeps its last [`MAX_LINES`] (10,000) lines; older ones are
//!    dropped, and a reader that falls behind is told how many it missed.
//! 3. A reader asks for the lines after the last number it has, at most
//!    [`MAX_READ`] (1,000) a request. An ended job's lines are forgotten.

use std::collections::{HashMap, VecDeque};

use crate::cluster::{bounded_text, ActorId, OutputLine};

/// Lines kept per job.
pub(super) const MAX_LINES: usize = 10_000;
/// Lines returned per request at most.
pub(super) const MAX_READ: usize = 1_000;

/// The node's buffer of printed lines, by job.
#[derive(Debug, Default)]
pub(super) struct JobOutput {
    /// Per job: the last number given, and the lines kept.
    jobs: HashMap<String, (u64, VecDeque<OutputLine>)>,
}

impl JobOutput {
    /// Step 1: `actor` (named `name`) of `job` printed `line`.
    pub(super) fn push(&mut self, job: &str, actor: ActorId, name: Option<String>, line: &str) {
        let (last, lines) = self.jobs.entry(job.to_string()).or_default();
        *last += 1;
        if lines.len() == MAX_LINES {
            lines.pop_front();
        }
        lines.push_back(OutputLine {
            seq: *last,
            actor,
            name,
            line: bounded_text(line.to_string()),
        });
    }

    /// Step 3: `job`'s lines after number `after`, at most `max`, and how
    /// many after it were dropped unread.
    pub(super) fn since(&self, job: &str, after: u64, max: usize) -> (Vec<OutputLine>, u64) {
        let Some((_, lines)) = self.jobs.get(job) else {
            return (Vec::new(), 0);
        };
        let dropped = lines
            .front()
            .map_or(0, |first| first.seq.saturating_sub(after + 1));
        let start = lines.partition_point(|line| line.seq <= after);
        let read = lines
            .iter()
            .skip(start)
            .take(max.min(MAX_READ))
            .cloned()
            .collect();
        (read, dropped)
    }

    /// Step 3: `job` ended.
    pub(super) fn forget(&mut self, job: &str) {
        self.jobs.remove(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_its_jobs_lines_in_order_and_learns_what_it_missed() {
        let mut output = JobOutput::default();
        let actor = ActorId(1);
        output.push("a", actor, None, "one");
        output.push("b", actor, None, "other job");
        output.push("a", actor, Some("n".into()), "two");
        let (lines, dropped) = output.since("a", 0, 10);
        let text: Vec<&str> = lines.iter().map(|l| l.line.as_str()).collect();
        assert_eq!((text, dropped), (vec!["one", "two"], 0));
        let (rest, _) = output.since("a", lines[0].seq, 10);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].name.as_deref(), Some("n"));
        assert!(output.since("a", lines[1].seq, 10).0.is_empty());

        for n in 0..MAX_LINES + 5 {
            output.push("c", actor, None, &n.to_string());
        }
        let (lines, dropped) = output.since("c", 0, usize::MAX);
        assert_eq!(lines.len(), MAX_READ);
        assert_eq!(dropped, 5);
        assert_eq!(lines[0].line, "5");
        output.forget("c");
        assert!(output.since("c", 0, 10).0.is_empty());
    }
}
