//! The tasks the head knows (`nimbus list tasks`): each submitting process
//! reports the latest state of its tasks about once a second
//! (`crate::task`'s `records.rs`); the head keeps the last [`MAX_TASKS`]
//! by when it first heard of them, a plain bounded table.

use std::collections::{HashMap, VecDeque};

use crate::cluster::{ObjectId, TaskRecord};

/// Tasks the head keeps.
pub const MAX_TASKS: usize = 10_000;

/// The last [`MAX_TASKS`] tasks, by id.
#[derive(Debug, Default)]
pub struct TaskTable {
    tasks: HashMap<ObjectId, TaskRecord>,
    /// Ids in the order first heard of, to forget the oldest.
    order: VecDeque<ObjectId>,
}

impl TaskTable {
    /// Records the latest state of each task in `records`.
    pub fn update(&mut self, records: Vec<TaskRecord>) {
        for mut record in records {
            record.error = record.error.map(crate::cluster::bounded_text);
            record.name = crate::cluster::bounded_text(record.name);
            if self.tasks.insert(record.id, record.clone()).is_none() {
                self.order.push_back(record.id);
            }
        }
        while self.order.len() > MAX_TASKS {
            if let Some(oldest) = self.order.pop_front() {
                self.tasks.remove(&oldest);
            }
        }
    }

    /// Every task kept, oldest first.
    pub fn list(&self) -> Vec<TaskRecord> {
        self.order
            .iter()
            .filter_map(|id| self.tasks.get(id).cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::TaskState;

    fn record(id: u64, state: TaskState) -> TaskRecord {
        TaskRecord {
            id: ObjectId(id),
            name: "t".into(),
            job: "j".into(),
            state,
            worker: None,
            attempts: 0,
            error: None,
            submitted_ms: id,
            ended_ms: None,
        }
    }

    #[test]
    fn the_latest_state_is_kept_for_the_last_tasks() {
        let mut table = TaskTable::default();
        table.update(vec![
            record(1, TaskState::Pending),
            record(2, TaskState::Running),
        ]);
        table.update(vec![record(1, TaskState::Finished)]);
        let listed = table.list();
        assert_eq!(listed.len(), 2);
        assert_eq!(
            (listed[0].id, listed[0].state),
            (ObjectId(1), TaskState::Finished)
        );
        table.update(
            (10..10 + MAX_TASKS as u64)
                .map(|i| record(i, TaskState::Pending))
                .collect(),
        );
        let listed = table.list();
        assert_eq!(listed.len(), MAX_TASKS);
        assert_eq!(listed[0].id, ObjectId(10), "the oldest are forgotten");
    }
}
