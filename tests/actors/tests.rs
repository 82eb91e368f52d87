//! The tests, in the order they run (the node-loss test kills a node of its
//! own, so the shared cluster stays usable).

use std::time::{Duration, Instant};

use actix::Actor;
use std::collections::HashSet;

use nimbus::actor::faults::{ActorFault, ActorFaultAction, FiredFault, ACTOR_FAULTS_ENV};
use nimbus::actor::{self, CallError, SpawnError, SpawnOptions, Strategy};
use nimbus::cluster::{ClusterEventKind, DeathCause, NodeState, ResourceSet};
use nimbus::object_store;
use nimbus::placement::{InBundle, PlacementError, PlacementGroup, PlacementStrategy};
use nimbus::Driver;

use crate::fixtures::*;
use crate::{boxed, Test};

pub const ALL: &[(&str, Test)] = &[
    // First, on the bare cluster: it counts the CPUs in use.
    (
        "a_dead_drivers_actors_and_placement_groups_are_released",
        |d| boxed(a_dead_drivers_actors_and_placement_groups_are_released(d)),
    ),
    (
        "an_asha_experiment_stops_bad_trials_and_keeps_its_files",
        |_| boxed(crate::tune::an_asha_experiment_stops_bad_trials_and_keeps_its_files()),
    ),
    ("a_tpe_experiment_learns_where_the_optimum_is", |_| {
        boxed(crate::tune::a_tpe_experiment_learns_where_the_optimum_is())
    }),
    ("failed_hung_and_lost_trials_are_retried_then_named", |_| {
        boxed(crate::tune::failed_hung_and_lost_trials_are_retried_then_named())
    }),
    (
        "pbt_exploits_copy_the_better_checkpoint_and_explore_within_bounds",
        |_| boxed(crate::tune::pbt_exploits_copy_the_better_checkpoint_and_explore_within_bounds()),
    ),
    (
        "a_time_budget_ends_an_experiment_even_with_a_hung_trial",
        |_| boxed(crate::tune::a_time_budget_ends_an_experiment_even_with_a_hung_trial()),
    ),
    ("bad_experiments_fail_at_once_naming_the_problem", |_| {
        boxed(crate::tune::bad_experiments_fail_at_once_naming_the_problem())
    }),
    ("placement_groups_of_each_strategy", |_| {
        boxed(placement_groups_of_each_strategy())
    }),
    ("a_restarted_head_keeps_its_members_and_actors", |_| {
        boxed(a_restarted_head_keeps_its_members_and_actors())
    }),
    ("tickets_are_renewed_before_they_expire", |_| {
        boxed(tickets_are_renewed_before_they_expire())
    }),
    ("removing_a_placement_group_frees_its_resources", |_| {
        boxed(removing_a_placement_group_frees_its_resources())
    }),
    ("an_actor_dies_with_the_actor_that_spawned_it", |_| {
        boxed(crate::owners::an_actor_dies_with_the_actor_that_spawned_it())
    }),
    ("spawn_lands_on_the_node_with_the_resources", |d| {
        boxed(spawn_lands_on_the_node_with_the_resources(d))
    }),
    ("a_spawn_waiting_for_room_is_a_pending_demand", |d| {
        boxed(a_spawn_waiting_for_room_is_a_pending_demand(d))
    }),
    (
        "impossible_or_busy_resources_fail_with_a_clear_error",
        |d| boxed(impossible_or_busy_resources_fail(d)),
    ),
    ("bad_resource_amounts_are_refused_by_name", |d| {
        boxed(bad_resource_amounts_are_refused_by_name(d))
    }),
    ("a_handle_passed_through_a_third_node_works", |_| {
        boxed(a_handle_passed_through_a_third_node_works())
    }),
    ("ten_thousand_messages_arrive_in_order", |_| {
        boxed(ten_thousand_messages_arrive_in_order())
    }),
    ("get_actor_by_name_from_another_node", |_| {
        boxed(get_actor_by_name_from_another_node())
    }),
    (
        "an_operator_lists_reads_the_log_of_and_kills_an_actor",
        |d| boxed(an_operator_lists_reads_the_log_of_and_kills_an_actor(d)),
    ),
    (
        "a_submitted_job_runs_streams_and_ends_with_its_actors",
        |d| boxed(crate::jobs::a_submitted_job_runs_streams_and_ends_with_its_actors(d)),
    ),
    ("a_jobs_working_directory_travels_with_it", |d| {
        boxed(crate::jobs::a_jobs_working_directory_travels_with_it(d))
    }),
    ("tasks_are_listed_with_their_state", |d| {
        boxed(crate::jobs::tasks_are_listed_with_their_state(d))
    }),
    ("a_failed_programs_local_cluster_keeps_its_logs", |d| {
        boxed(crate::jobs::a_failed_programs_local_cluster_keeps_its_logs(
            d,
        ))
    }),
    ("a_workers_log_is_rotated_past_its_limit", |d| {
        boxed(a_workers_log_is_rotated_past_its_limit(d))
    }),
    ("what_an_actor_prints_shows_in_its_drivers_output", |d| {
        boxed(what_an_actor_prints_shows_in_its_drivers_output(d))
    }),
    (
        "actor_code_cannot_speak_for_the_head_or_another_actor",
        |_| boxed(actor_code_cannot_speak_for_the_head_or_another_actor()),
    ),
    (
        "sigkill_of_a_worker_is_reported_and_restarted_per_policy",
        |_| boxed(sigkill_of_a_worker()),
    ),
    (
        "a_reply_goes_out_while_the_next_handler_holds_the_actors_thread",
        |_| boxed(a_reply_goes_out_while_the_next_handler_holds_the_actors_thread()),
    ),
    ("a_reply_queued_behind_one_written_at_once_goes_out", |_| {
        boxed(a_reply_queued_behind_one_written_at_once_goes_out())
    }),
    (
        "a_worker_whose_child_holds_its_stdout_is_still_seen_dying",
        |_| boxed(a_worker_whose_child_holds_its_stdout_is_still_seen_dying()),
    ),
    ("a_handler_panic_kills_only_its_actor", |_| {
        boxed(a_handler_panic_kills_only_its_actor())
    }),
    ("an_unknown_message_type_is_a_clear_error", |_| {
        boxed(an_unknown_message_type_is_a_clear_error())
    }),
    ("injected_actor_faults_fire_at_their_message_count", |d| {
        boxed(injected_actor_faults_fire_at_their_message_count(d))
    }),
    ("chaos_run_replays_actor_faults_by_message_count", |d| {
        boxed(chaos_run_replays_actor_faults_by_message_count(d))
    }),
    ("objects_put_here_are_read_on_other_nodes", |d| {
        boxed(objects_put_here_are_read_on_other_nodes(d))
    }),
    ("a_put_that_cannot_fit_fails_clearly", |d| {
        boxed(a_put_that_cannot_fit_fails_clearly(d))
    }),
    ("a_second_driver_joins_by_address", |d| {
        boxed(a_second_driver_joins_by_address(d))
    }),
    ("spread_spawns_in_quick_succession_alternate", |d| {
        boxed(spread_spawns_in_quick_succession_alternate(d))
    }),
    ("actors_of_a_lost_node_restart_on_another_node", |d| {
        boxed(actors_of_a_lost_node_restart_on_another_node(d))
    }),
    ("a_lost_actor_no_node_can_take_dies_saying_why", |d| {
        boxed(a_lost_actor_no_node_can_take_dies_saying_why(d))
    }),
    (
        "killing_an_actor_being_restarted_elsewhere_keeps_it_dead",
        |d| boxed(killing_an_actor_being_restarted_elsewhere_keeps_it_dead(d)),
    ),
    ("actors_of_a_lost_node_are_reported_dead", |d| {
        boxed(actors_of_a_lost_node_are_reported_dead(d))
    }),
    ("actors_of_a_node_that_left_are_dead_or_restarted", |d| {
        boxed(actors_of_a_node_that_left_are_dead_or_restarted(d))
    }),
    ("a_named_actor_is_killed_at_a_planned_time", |d| {
        boxed(a_named_actor_is_killed_at_a_planned_time(d))
    }),
    ("actors_of_a_type_are_killed_at_a_planned_time", |d| {
        boxed(actors_of_a_type_are_killed_at_a_planned_time(d))
    }),
    ("a_named_actor_panics_at_a_planned_time", |d| {
        boxed(a_named_actor_panics_at_a_planned_time(d))
    }),
    (
        "huge_panic_messages_leave_the_event_history_readable",
        |d| boxed(huge_panic_messages_leave_the_event_history_readable(d)),
    ),
    (
        "actors_see_only_their_own_gpus_by_the_nodes_device_ids",
        |d| boxed(actors_see_only_their_own_gpus_by_the_nodes_device_ids(d)),
    ),
    // Last: the killed driver's runners hold CPUs until its job ends.
    (
        "a_restored_experiment_finishes_what_a_killed_driver_left",
        |d| boxed(crate::tune::a_restored_experiment_finishes_what_a_killed_driver_left(d)),
    ),
];

/// This test binary as a second driver of `cluster`, in the mode the
/// environment variable `mode` selects (`main.rs`).
pub(crate) fn second_driver(
    cluster: &nimbus::local::LocalCluster,
    mode: &str,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .env(mode, "1")
        .env("NIMBUS_ADDRESS", cluster.address().to_string())
        .env("NIMBUS_TOKEN", cluster.token().to_string())
        .kill_on_drop(true);
    command
}

/// The lines of a child's output pipe.
fn lines_of<R: tokio::io::AsyncRead>(pipe: R) -> tokio::io::Lines<tokio::io::BufReader<R>> {
    tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(pipe))
}

/// Whether `lines` yields `expected` within `within` (`Err` past it).
async fn shows_line<R: tokio::io::AsyncRead + Unpin>(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<R>>,
    expected: &str,
    within: Duration,
) -> Result<bool, tokio::time::error::Elapsed> {
    tokio::time::timeout(within, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line == expected {
                return true;
            }
        }
        false
    })
    .await
}

fn cpus(n: f64) -> ResourceSet {
    ResourceSet::of("CPU", n)
}

fn distinct(group: &PlacementGroup) -> usize {
    let nodes: HashSet<&str> = (0..group.len()).map(|i| group.node(i).unwrap()).collect();
    nodes.len()
}

/// The first tests run on the bare 3-node cluster (2 CPUs per node here).
async fn placement_groups_of_each_strategy() {
    let deadline = Duration::from_secs(10);
    let create = |n, cpu, strategy| PlacementGroup::create(vec![cpus(cpu); n], strategy, deadline);

    let group = create(2, 0.5, PlacementStrategy::StrictPack).await.unwrap();
    assert_eq!(distinct(&group), 1);
    group.remove().await.unwrap();
    let group = create(2, 0.5, PlacementStrategy::Pack).await.unwrap();
    assert_eq!(distinct(&group), 1);
    group.remove().await.unwrap();
    let group = create(3, 0.5, PlacementStrategy::StrictSpread)
        .await
        .unwrap();
    assert_eq!(distinct(&group), 3);
    // An actor placed in a bundle lands on that bundle's node.
    let options = SpawnOptions::default()
        .num_cpus(0.5)
        .in_bundle(&group, 2)
        .unwrap();
    let counter = actor::spawn::<Counter>(0, options).await.unwrap();
    assert_eq!(
        counter.record().await.unwrap().node.name,
        group.node(2).unwrap()
    );
    group.remove().await.unwrap();
    let group = create(3, 0.5, PlacementStrategy::Spread).await.unwrap();
    assert_eq!(distinct(&group), 3);
    group.remove().await.unwrap();

    for (n, cpu, strategy) in [
        (4, 0.5, PlacementStrategy::StrictSpread),
        (3, 1.0, PlacementStrategy::StrictPack),
    ] {
        match create(n, cpu, strategy).await {
            Err(PlacementError::Infeasible { .. }) => {}
            other => {
                panic!("{n} x {cpu} CPU with {strategy:?} should be infeasible, got {other:?}")
            }
        }
    }
}

async fn removing_a_placement_group_frees_its_resources() {
    // Fill every node's two CPUs (one holds the 0.5 CPU counter above).
    let mut groups = Vec::new();
    for _ in 0..2 {
        let group = PlacementGroup::create(
            vec![cpus(2.0)],
            PlacementStrategy::StrictPack,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        groups.push(group);
    }
    let full = PlacementGroup::create(
        vec![cpus(2.0)],
        PlacementStrategy::StrictPack,
        Duration::from_secs(1),
    )
    .await;
    // The timeout says what each node had free.
    match &full {
        Err(e @ PlacementError::Timeout { .. }) => {
            let message = e.to_string();
            for node in ["head", "node-1", "node-2"] {
                assert!(message.contains(&format!("{node} has ")), "{message}");
            }
        }
        other => panic!("{other:?}"),
    }
    let freed = groups.pop().unwrap();
    freed.remove().await.unwrap();
    let again = PlacementGroup::create(
        vec![cpus(2.0)],
        PlacementStrategy::StrictPack,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    again.remove().await.unwrap();
    for group in groups {
        group.remove().await.unwrap();
    }
}

/// The index of the cluster's node named `name`.
fn node_index(cluster: &nimbus::local::LocalCluster, name: &str) -> usize {
    cluster
        .nodes()
        .iter()
        .position(|n| n.name() == name)
        .unwrap()
}

fn on(node: &str) -> SpawnOptions {
    SpawnOptions::default()
        .num_cpus(0.1)
        .strategy(Strategy::Node(node.into()))
}

/// Actor code is confined to its job (#51, high 4), tried while the orphan
/// driver's job runs: an actor of this job can neither kill, read the log
/// of, read the output of nor spawn for that job, nor read its node's log,
/// upload a program it does not run, list a node's objects or drop a copy,
/// write that job's library records,
/// nor read or change that job's objects, nor find or call that job's
/// actors, but it can kill an actor of its own job and find and call the
/// other job's shared one; no node or worker process of the cluster holds
/// the token in its environment or arguments (a node gets it on its
/// stdin); and, in its sandbox, it finds the token in no file of the
/// state directory and can neither read the environment of nor signal the
/// cluster's processes and its driver. Before, each was accepted, every
/// member node had `NIMBUS_TOKEN` in its environment, and `token` and
/// `head.redb` were readable.
async fn actor_code_stays_within_its_job(
    cluster: &nimbus::local::LocalCluster,
    objects: Vec<nimbus::cluster::ObjectId>,
    objects_at: String,
) {
    let victim = actor::get_actor::<Counter>("orphan-0")
        .await
        .unwrap()
        .expect("the orphan driver's actor");
    let record = victim.record().await.unwrap();
    let probe = actor::spawn::<Counter>(0, on("node-2")).await.unwrap();
    let sibling = actor::spawn::<Counter>(0, on("node-1")).await.unwrap();
    let trespass = Trespass {
        victim: victim.clone(),
        victim_name: "orphan-0".into(),
        victim_node: record.node.name,
        victim_at: (record.address, record.incarnation),
        shared: "survivor".into(),
        victim_job: record.job,
        sibling: sibling.id(),
        me: probe.id(),
        token: cluster.token().to_string(),
        pids: cluster
            .processes()
            .into_iter()
            .chain([std::process::id()])
            .collect(),
        home: cluster.home().to_path_buf(),
        objects,
        objects_at,
    };
    let outcomes = probe.send(trespass).await.unwrap();
    let refused = [
        "a State request",
        "KillActor",
        "ReadLog",
        "ReadOutput/ReadJobLog/ReserveBundle",
        "StartActor",
        "ReadNodeLog",
        "UploadBinary/ReadBinary",
        "ListObjects",
        "FreeObject",
    ];
    // Reading the other job's small and large object, mapping the large
    // one and waiting for it where it is, taking a reference to the small
    // one, failing it, abandoning the large one, writing into it, pulling
    // it to the victim's node, and taking a reference to and failing the
    // one that does not exist yet: each refused, the object named.
    let object_probes = 11;
    // Finding the victim by id and by name, calling it, and calling it at
    // its worker's address: refused; the shared actor found and called.
    let actor_probes = 5;
    assert_eq!(
        outcomes.len(),
        refused.len() + 1 + object_probes + actor_probes,
        "{outcomes:#?}"
    );
    for (outcome, request) in outcomes.iter().zip(refused) {
        assert!(
            outcome.contains(&format!("may not send {request}")),
            "{request}: {outcome}"
        );
    }
    assert_eq!(
        outcomes[refused.len()],
        "accepted: Workers(Ack)",
        "{outcomes:#?}"
    );
    let (objects, actors) = outcomes[refused.len() + 1..].split_at(object_probes);
    for outcome in objects {
        assert!(
            outcome.contains("is another job's: a worker of job"),
            "{outcomes:#?}"
        );
    }
    for outcome in &actors[..3] {
        assert!(
            outcome.contains("finds only its own job's actors and shared ones"),
            "{outcomes:#?}"
        );
    }
    assert!(
        actors[3].contains("calls only its own job's actors and shared ones"),
        "{outcomes:#?}"
    );
    assert_eq!(actors[4], "shared: 0", "{outcomes:#?}");
    let mut seen = 0;
    let death = tokio::time::timeout(
        Duration::from_secs(20),
        actor::next_death(&sibling, &mut seen),
    )
    .await
    .expect("the sibling killed by its own job's actor dies")
    .unwrap();
    assert!(!death.restarting, "{death:?}");
    assert_eq!(victim.send(Add(0)).await.unwrap(), 0, "the victim lives");
    probe.kill().await.unwrap();
}

/// The file the orphan driver writes in its job's shared-memory directory,
/// which another job's worker must not find.
pub const SEGMENT: &str = "orphan-segment";

/// The node holding object `id` (as its listing shows it), if any.
async fn holder_of(client: &nimbus::client::ClusterClient, id: &str) -> Option<String> {
    let status = client.status().await.unwrap();
    for node in status.alive() {
        let listing = client.objects(node).await.unwrap();
        if listing.objects.iter().any(|o| o.id.to_string() == id) {
            return Some(node.id.clone());
        }
    }
    None
}

/// Ray's job ownership: a driver killed outright leaves nothing held. Its
/// actors are killed and its placement group released once the head has
/// not heard from it for the grace period (5 s here), its detached actor
/// lives on. Before, all of it was held for ever.
async fn a_dead_drivers_actors_and_placement_groups_are_released(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let client = cluster.client().await.unwrap();
    let used = |status: &nimbus::cluster::ClusterStatus| -> f64 {
        status.alive().map(|n| n.resources.used.amount("CPU")).sum()
    };
    let before = used(&client.status().await.unwrap());
    let mut orphan = second_driver(cluster, crate::ORPHAN_DRIVER)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = lines_of(orphan.stdout.take().unwrap());
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    let objects: Vec<String> = match &ready {
        Ok(Ok(Some(line))) => line
            .strip_prefix("ready ")
            .map(|ids| ids.split(' ').map(str::to_string).collect()),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{ready:?}"));
    let object = objects[0].clone();
    let holds = || async { holder_of(&client, &object).await.is_some() };
    let objects_at = holder_of(&client, &objects[1]).await;
    assert!(holds().await, "the driver's object {object} is stored");
    let held = before + 0.5 + 0.5 + 0.1 + 0.5;
    client
        .wait_for_status(
            "the driver's actors and bundle held",
            Duration::from_secs(20),
            |s| (used(s) - held).abs() < 1e-6,
        )
        .await
        .unwrap();
    let objects_at = objects_at.expect("the driver's large object is stored");
    let objects = objects
        .iter()
        .map(|id| nimbus::cluster::ObjectId(u64::from_str_radix(id, 16).unwrap()))
        .collect();
    actor_code_stays_within_its_job(cluster, objects, objects_at).await;
    let victim_job = actor::get_actor::<Counter>("orphan-0")
        .await
        .unwrap()
        .expect("the orphan driver's actor")
        .record()
        .await
        .unwrap()
        .job;
    let shm = std::path::Path::new(nimbus::host::shared_memory::SHM);
    let segments = nimbus::host::shared_memory::job_segments_dir(shm, &victim_job).unwrap();
    std::fs::remove_file(segments.join(SEGMENT)).unwrap();

    orphan.start_kill().unwrap();
    orphan.wait().await.unwrap();
    let killed = Instant::now();
    let freed = before + 0.1;
    client
        .wait_for_status(
            "the dead driver's CPUs free again",
            Duration::from_secs(30),
            |s| (used(s) - freed).abs() < 1e-6,
        )
        .await
        .unwrap();
    // The grace counts from the driver's last beat, up to a second before
    // it was killed.
    let took = killed.elapsed();
    let grace = Duration::from_secs(5);
    assert!(
        took >= grace - nimbus::cluster::DRIVER_BEAT && took < grace * 2,
        "freed once the grace passed, not before: {took:?}"
    );
    for i in 0..2 {
        let name = format!("orphan-{i}");
        assert!(
            actor::get_actor::<Counter>(&name).await.unwrap().is_none(),
            "{name} lives"
        );
    }
    let freed = nimbus::testing::check::wait_until(
        "the dead driver's object is freed",
        Duration::from_secs(10),
        || async { (!holds().await).then_some(()) },
    )
    .await;
    assert!(
        freed.is_ok(),
        "{freed:?} (before: held until its owner node stopped)"
    );
    let survivor = actor::get_actor::<Counter>("survivor")
        .await
        .unwrap()
        .expect("a detached actor outlives its driver");
    assert_eq!(survivor.send(Add(1)).await.unwrap(), 1);
    survivor.kill().await.unwrap();
    client
        .wait_for_status(
            "the detached actor's CPU free",
            Duration::from_secs(20),
            |s| (used(s) - before).abs() < 1e-6,
        )
        .await
        .unwrap();
}

async fn spawn_lands_on_the_node_with_the_resources(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let special = cluster
        .add_node(&["--resources", r#"{"special": 1}"#])
        .expect("a node with a custom resource joins");
    let name = cluster.node(special).unwrap().name().to_string();
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("special", 1.0);
    let counter = actor::spawn::<Counter>(1, options).await.unwrap();
    assert_eq!(counter.record().await.unwrap().node.name, name);
    assert_eq!(counter.send(Add(1)).await.unwrap(), 2);
    // Worker processes are findable by operators: this actor's own
    // process carries `nimbus-worker` and the actor's id in its arguments.
    let pid = nimbus::local::worker_pid(counter.id()).expect("the actor's worker process");
    let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args = String::from_utf8_lossy(&args).replace('\0', " ");
    assert!(
        args.contains("nimbus-worker") && args.contains(&counter.id().to_string()),
        "{args}"
    );
}

/// `ray status`'s pending demands: a spawn that waits for room is listed
/// by `nimbus status` with what it asks for, until it is placed.
async fn a_spawn_waiting_for_room_is_a_pending_demand(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    cluster
        .add_node(&["--resources", r#"{"scarce": 1}"#])
        .expect("a node with a custom resource joins");
    let operator = crate::jobs::Operator::of(cluster);
    let scarce = || {
        SpawnOptions::default()
            .num_cpus(0.1)
            .resource("scarce", 1.0)
    };
    let blocker = actor::spawn::<Counter>(0, scarce()).await.unwrap();
    let waiter = actix::spawn(actor::spawn::<Counter>(
        0,
        scarce().deadline(Duration::from_secs(60)),
    ));
    let pending = || async {
        let (code, out, err) = operator.run(&["status", "--json"]).await;
        assert_eq!(code, Some(0), "{err}");
        let status: serde_json::Value = serde_json::from_str(&out).unwrap();
        status["pending"].as_array().unwrap().clone()
    };
    let listed = nimbus::testing::check::wait_until(
        "the waiting spawn is a pending demand",
        Duration::from_secs(20),
        || async {
            let pending = pending().await;
            (pending.len() == 1).then_some(pending)
        },
    )
    .await
    .unwrap();
    assert_eq!(listed[0]["class"], "tests.Counter", "{listed:?}");
    assert_eq!(listed[0]["resources"]["scarce"], 1.0, "{listed:?}");
    let (code, table, err) = operator.run(&["status"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        table.contains("pending: 1 actor waiting for CPU=0.1 scarce=1"),
        "{table}"
    );
    blocker.kill().await.unwrap();
    let placed = waiter
        .await
        .unwrap()
        .expect("placed once the blocker is gone");
    assert!(
        pending().await.is_empty(),
        "a placed spawn is no longer pending"
    );
    placed.kill().await.unwrap();
}

async fn impossible_or_busy_resources_fail(_: &mut Driver) {
    let started = Instant::now();
    let options = SpawnOptions::default().resource("unobtainium", 1.0);
    match actor::spawn::<Counter>(0, options).await {
        Err(SpawnError::Unsatisfiable { needs, detail }) => {
            assert!(needs.contains("unobtainium"), "{needs}");
            assert!(detail.contains("offers"), "{detail}");
        }
        other => panic!("expected Unsatisfiable, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "impossible requests fail fast"
    );

    // Pinned to a node name the cluster does not have: not a capacity
    // problem; the error names the node and those there are.
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .strategy(Strategy::Node("node-9".into()));
    let missing = actor::spawn::<Counter>(0, options).await.unwrap_err();
    assert!(
        matches!(&missing, SpawnError::NoSuchNode { node, .. } if node == "node-9"),
        "{missing:?}"
    );
    let said = missing.to_string();
    assert!(
        said.starts_with("no node of the cluster is named \"node-9\" (its nodes: ")
            && ["head", "node-1", "node-2"]
                .iter()
                .all(|n| said.contains(n)),
        "{said}"
    );

    // The one "special" resource is held by the first test's counter.
    let deadline = Duration::from_secs(2);
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("special", 1.0)
        .deadline(deadline);
    let started = Instant::now();
    match actor::spawn::<Counter>(0, options).await {
        Err(SpawnError::NoCapacity { last, .. }) => assert!(last.contains("special"), "{last}"),
        other => panic!("expected NoCapacity, got {other:?}"),
    }
    assert!(started.elapsed() >= deadline && started.elapsed() < deadline * 5);
}

/// A negative, infinite or NaN amount is refused by name before anything
/// is asked of the cluster, for actors, placement-group bundles and tasks
/// alike (a node refuses one sent to it directly too: a unit test of its
/// resource pool).
async fn bad_resource_amounts_are_refused_by_name(_: &mut Driver) {
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        let options = SpawnOptions::default().num_cpus(bad);
        match actor::spawn::<Counter>(0, options).await {
            Err(SpawnError::BadResources(e)) => {
                assert!(e.to_string().contains("\"CPU\""), "{e}")
            }
            other => panic!("expected BadResources for {bad}, got {other:?}"),
        }
        let bundle = ResourceSet::of("CPU", 1.0).with("GPU", bad);
        let created = PlacementGroup::create(
            vec![ResourceSet::of("CPU", 0.1), bundle],
            PlacementStrategy::Pack,
            Duration::from_secs(1),
        )
        .await;
        match created {
            Err(PlacementError::BadBundle { index: 1, cause }) => {
                assert!(cause.to_string().contains("\"GPU\""), "{cause}")
            }
            other => panic!("expected BadBundle for {bad}, got {other:?}"),
        }
    }
}

async fn a_handle_passed_through_a_third_node_works() {
    let counter = actor::spawn::<Counter>(100, on("node-1")).await.unwrap();
    let relay = actor::spawn::<Relay>((), on("node-2")).await.unwrap();
    let forwarded = relay
        .send(Forward {
            counter: counter.clone(),
            n: 5,
        })
        .await
        .unwrap();
    assert_eq!(forwarded, Ok(105));
    assert_eq!(counter.send(Add(0)).await.unwrap(), 105);
}

async fn ten_thousand_messages_arrive_in_order() {
    let sequencer = actor::spawn::<Sequencer>((), on("node-1")).await.unwrap();
    let mut pending = Vec::new();
    for n in 0..10_000u64 {
        if n % 100 == 99 {
            pending.push(sequencer.send(Push(n)));
        } else {
            sequencer.do_send(Push(n)).unwrap();
        }
    }
    for reply in futures::future::join_all(pending).await {
        reply.unwrap();
    }
    assert_eq!(sequencer.send(Seen).await.unwrap(), (10_000, 0));
}

async fn get_actor_by_name_from_another_node() {
    let options = on("node-1").name("named-counter");
    let counter = actor::spawn::<Counter>(7, options).await.unwrap();
    let again = actor::spawn::<Counter>(0, on("node-1").name("named-counter")).await;
    assert!(matches!(again, Err(SpawnError::NameTaken(_))), "{again:?}");
    let relay = actor::spawn::<Relay>((), on("node-2")).await.unwrap();
    let reply = relay
        .send(AddToNamed {
            name: "named-counter".into(),
            n: 3,
        })
        .await
        .unwrap();
    assert_eq!(reply, Ok(10));
    let found = actor::get_actor::<Counter>("named-counter")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id(), counter.id());
    assert!(actor::get_actor::<Counter>("nobody")
        .await
        .unwrap()
        .is_none());
}

/// The pid of the worker hosting `actor`.
fn worker_pid(actor: nimbus::cluster::ActorId) -> i32 {
    nimbus::local::worker_pid(actor).unwrap_or_else(|| panic!("no worker process hosts {actor}"))
}

/// The node watches the worker process itself: a child the actor started
/// keeps the worker's stdout open, and the worker's death is reported all
/// the same.
async fn a_worker_whose_child_holds_its_stdout_is_still_seen_dying() {
    let counter = actor::spawn::<Counter>(0, on("node-1")).await.unwrap();
    let child = counter.send(StartChild).await.unwrap();
    let mut seen = 0;
    // SAFETY: kill() has no memory-safety preconditions.
    unsafe { libc::kill(worker_pid(counter.id()), libc::SIGKILL) };
    let death = actor::next_death(&counter, &mut seen).await;
    // SAFETY: as above; the child is ours to stop (it outlives the worker).
    unsafe { libc::kill(child as libc::pid_t, libc::SIGKILL) };
    let death = death.unwrap();
    assert_eq!(death.reason, DeathCause::Killed { signal: 9 });
    assert!(!death.restarting);
}

/// `nimbus list actors|placement-groups`, `nimbus logs` and `nimbus kill`
/// from another process, as an operator runs them: what the actor printed to stdout is
/// in its log on its node (before, the node threw it away).
async fn an_operator_lists_reads_the_log_of_and_kills_an_actor(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let operator = crate::jobs::Operator::of(cluster);
    let printer = actor::spawn::<Counter>(0, on("node-2").name("printer"))
        .await
        .unwrap();
    let line = format!("printed by {} on node-2", printer.id());
    printer.send(Print(line.clone())).await.unwrap();

    let (code, listed, err) = operator
        .run(&[
            "list",
            "actors",
            "--json",
            "--filter",
            "name=printer",
            "--filter",
            "state=ALIVE",
        ])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["id"], printer.id().to_string());
    assert_eq!(rows[0]["node"], "node-2");
    assert_eq!(rows[0]["state"], "ALIVE");
    assert_eq!(rows[0]["class"], "tests.Counter");
    assert!(rows[0]["pid"].as_u64().unwrap() > 0, "{listed}");
    let group = PlacementGroup::create(
        vec![cpus(0.1), cpus(0.1)],
        PlacementStrategy::StrictSpread,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let id = format!("{:016x}", group.id().0);
    let filter = format!("id={id}");
    let (code, listed, err) = operator
        .run(&["list", "placement-groups", "--json", "--filter", &filter])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let groups: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(groups.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(groups[0]["bundles"], 2, "{listed}");
    assert_eq!(
        groups[0]["job"],
        actor::ProcessContext::current().unwrap().job.as_str()
    );
    for index in 0..2 {
        let at = format!("{index}@{}:CPU=0.1", group.node(index).unwrap());
        assert!(
            groups[0]["resources"].as_str().unwrap().contains(&at),
            "{listed}"
        );
    }
    group.remove().await.unwrap();
    let (code, listed, err) = operator
        .run(&["list", "placement-groups", "--json", "--filter", &filter])
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(listed.trim(), "[]", "a removed group is gone");
    let (code, _, err) = operator
        .run(&["list", "actors", "--filter", "colour=red"])
        .await;
    assert!(
        code != Some(0) && err.contains("--filter colour: no such column"),
        "{err}"
    );

    // The node appends the line to the log as it reads the worker's
    // stdout: `--follow` prints it once it is there, and ends once the
    // actor's worker is dead.
    let mut follow = operator
        .command(&["logs", "printer", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = lines_of(follow.stdout.take().unwrap());
    let shown = shows_line(&mut lines, &line, Duration::from_secs(20)).await;
    assert_eq!(
        shown,
        Ok(true),
        "`nimbus logs --follow` showed the printed line"
    );
    printer.send(Trace("a traced event".into())).await.unwrap();
    let (code, tail, err) = operator.run(&["logs", "printer", "--tail", "50"]).await;
    assert!(code == Some(0) && tail.contains(&line), "{tail}{err}");
    assert!(!tail.contains("a traced event"), "stdout only: {tail}");
    let (code, errors, err) = operator
        .run(&["logs", "printer", "--stderr", "--tail", "50"])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let job = actor::ProcessContext::current().unwrap().job.clone();
    let tags = format!("job={job} actor={} node=node-2 ", printer.id());
    assert!(
        errors
            .lines()
            .any(|l| l.starts_with(&tags) && l.contains("a traced event")),
        "a worker's events, in its stderr log, carry its job, actor and node: {errors}"
    );
    assert!(!errors.contains(&line), "stderr only: {errors}");
    let (code, node_log, err) = operator
        .run(&["logs", "--node", "node-2", "--tail", "100000"])
        .await;
    assert!(
        code == Some(0) && node_log.contains("node up"),
        "a node's own log: {node_log}{err}"
    );

    let mut seen = 0;
    let (code, killed, err) = operator.run(&["kill", "printer"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(killed.trim(), format!("killed: {}", printer.id()));
    let death = actor::next_death(&printer, &mut seen).await.unwrap();
    assert!(!death.restarting, "{death:?}");
    let ended = tokio::time::timeout(Duration::from_secs(20), follow.wait()).await;
    assert!(
        matches!(&ended, Ok(Ok(status)) if status.success()),
        "`--follow` ends with the worker: {ended:?}"
    );
    let alive = ["list", "actors", "--json", "--filter", "name=printer"];
    let (code, listed, err) = operator
        .run(&[&alive[..], &["--filter", "state=ALIVE"]].concat())
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(listed.trim(), "[]");
    // Killed, it is still listed, dead, with the cause.
    let (code, listed, err) = operator
        .run(&[&alive[..], &["--filter", "state=DEAD"]].concat())
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(listed.contains(&printer.id().to_string()), "{listed}");
    let (code, _, err) = operator.run(&["kill", "printer"]).await;
    assert!(
        code != Some(0) && err.contains("no actor named \"printer\""),
        "{err}"
    );
}

/// A chatty actor's stderr log is rotated once past the node's
/// `--log-max-mib`: the old part kept as `NAME.err.1`, the log itself
/// starting over (its worker writes stderr to it directly, and goes on
/// writing there).
async fn a_workers_log_is_rotated_past_its_limit(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    cluster
        .add_node(&["--log-max-mib", "1", "--resources", r#"{"rotating": 1}"#])
        .expect("a node with a 1 MiB log limit joins");
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("rotating", 1.0);
    let chatty = actor::spawn::<Counter>(0, options).await.unwrap();
    chatty.send(Chatter(3 << 20)).await.unwrap();
    let client = cluster.client().await.unwrap();
    let record = chatty.record().await.unwrap();
    let file = client.read_log(&record, true, 0, 0).await.unwrap().file;
    let previous = std::path::PathBuf::from(format!("{file}.1"));
    let rotated = nimbus::testing::check::wait_until(
        "the log is rotated",
        Duration::from_secs(20),
        || async { previous.exists().then_some(()) },
    )
    .await;
    assert!(rotated.is_ok(), "{rotated:?}");
    assert!(std::fs::metadata(&previous).unwrap().len() > 1 << 20);
    chatty.send(Chatter(1)).await.unwrap();
    let seen = nimbus::testing::check::wait_until(
        "the worker writes on into the rotated log",
        Duration::from_secs(20),
        || async {
            let log = client.read_log(&record, true, 0, 4 << 20).await.unwrap();
            // The last write, a line of 256 KiB, landed in the rotated log.
            (log.total > 0 && log.total < 3 << 20).then_some(())
        },
    )
    .await;
    assert!(seen.is_ok(), "{seen:?}");
    chatty.kill().await.unwrap();
}

/// Ray's `log_to_driver`: a line an actor prints on another node shows in
/// its driver's output, prefixed with the actor and the node. Before, the
/// node threw it away.
async fn what_an_actor_prints_shows_in_its_drivers_output(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let mut printing = second_driver(cluster, crate::PRINTING_DRIVER)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = lines_of(printing.stderr.take().unwrap());
    let expected = "(shouter on node-1) shouting from node-1";
    let shown = shows_line(&mut lines, expected, Duration::from_secs(30)).await;
    assert_eq!(shown, Ok(true), "the driver showed {expected:?}");
    // What it writes to stderr (a tracing event here) shows too.
    let traced = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("(shouter on node-1) ") && line.contains("tracing from node-1") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        traced,
        Ok(true),
        "the driver showed the actor's stderr line"
    );
    printing.start_kill().unwrap();
    printing.wait().await.unwrap();
    let shouter = actor::get_actor::<Counter>("shouter")
        .await
        .unwrap()
        .unwrap();
    shouter.kill().await.unwrap();
}

/// A worker holds a ticket for itself, not the token: the head refuses it
/// a leave or heartbeat in the head's name and a death report for another
/// actor (before tickets, each was taken: the head left its own cluster).
async fn actor_code_cannot_speak_for_the_head_or_another_actor() {
    let victim = actor::spawn::<Counter>(0, on("node-1")).await.unwrap();
    let intruder = actor::spawn::<Counter>(0, on("node-2")).await.unwrap();
    let token = intruder.send(EnvVar("NIMBUS_TOKEN".into())).await.unwrap();
    assert_eq!(token, None, "a worker's environment holds no token");
    let outcomes = intruder
        .send(Impersonate {
            victim: victim.id(),
        })
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    for (outcome, request) in outcomes.iter().zip(["Leave", "Heartbeat", "ActorDown"]) {
        assert!(
            outcome.contains(&format!("may not send {request}")),
            "{request}: {outcome}"
        );
    }
    assert_eq!(victim.send(Add(2)).await.unwrap(), 2, "the victim lives");
    let head = actor::spawn::<Counter>(0, on("head")).await.unwrap();
    assert_eq!(head.send(Add(3)).await.unwrap(), 3, "the head still serves");
    for counter in [victim, intruder, head] {
        counter.kill().await.unwrap();
    }
}

/// A counter on node-1 whose worker is up (it answered one call), and a
/// path, named for it, for the file that releases its `HoldUntil` calls.
async fn counter_and_release_path(
    what: &str,
) -> (nimbus::actor::ActorHandle<Counter>, std::path::PathBuf) {
    let counter = actor::spawn::<Counter>(0, on("node-1")).await.unwrap();
    assert_eq!(counter.send(Add(1)).await.unwrap(), 1);
    let release = std::env::temp_dir().join(format!(
        "nimbus-test-{what}-{}-{}",
        std::process::id(),
        counter.id()
    ));
    (counter, release)
}

/// Two calls sent together to an actor on this host: the first one's
/// reply reaches the caller while the second one's handler still holds the
/// actor's thread (a reply goes out as soon as its handler returns, not
/// once the calls queued behind it are handled too). The test releases the
/// second handler only once the first reply is in, so a reply held back
/// fails it.
async fn a_reply_goes_out_while_the_next_handler_holds_the_actors_thread() {
    let (counter, release) = counter_and_release_path("release").await;
    let add = counter.send(Add(2));
    let hold = counter.send(HoldUntil(release.display().to_string()));
    let first = async {
        let added = tokio::time::timeout(HOLD_AT_MOST / 2, add).await;
        std::fs::write(&release, b"").unwrap();
        added
    };
    let (added, held) = futures::join!(first, hold);
    std::fs::remove_file(&release).unwrap();
    let added = added.expect("the first reply came while the second handler ran");
    assert_eq!(added.unwrap(), 3);
    assert!(held.unwrap(), "the second handler saw its release");
    counter.kill().await.unwrap();
}

/// On a same-host channel a reply ready when its handler returns is
/// written by the actor's thread (`transport/answer.rs`); the worker's
/// writer must still move on to the calls queued behind it: here a
/// handler returning a future, whose reply the writer waits for.
async fn a_reply_queued_behind_one_written_at_once_goes_out() {
    let (counter, release) = counter_and_release_path("released").await;
    std::fs::write(&release, b"").unwrap();
    // Sent together: the worker has both before the first is answered.
    let first = counter.send(HoldUntil(release.display().to_string()));
    let second = counter.send(SlowAdd(2, 0));
    let both = tokio::time::timeout(HOLD_AT_MOST / 2, futures::future::join(first, second)).await;
    std::fs::remove_file(&release).unwrap();
    let (first, second) = both.expect("both replies came");
    assert!(first.unwrap());
    assert_eq!(second.unwrap(), 3);
    counter.kill().await.unwrap();
}

async fn sigkill_of_a_worker() {
    let counter = actor::spawn::<Counter>(0, on("node-2").max_restarts(1))
        .await
        .unwrap();
    assert_eq!(counter.send(Add(5)).await.unwrap(), 5);
    let (deaths_tx, mut deaths) = tokio::sync::mpsc::unbounded_channel();
    let watcher = Watcher(deaths_tx).start();
    actor::monitor(&counter, watcher.recipient()).unwrap();
    let first = counter.record().await.unwrap();
    let mut seen = 0;

    let in_flight = counter.send(SlowAdd(1, 60_000));
    let kill = async {
        tokio::task::yield_now().await;
        // SAFETY: kill() has no memory-safety preconditions.
        unsafe { libc::kill(worker_pid(counter.id()), libc::SIGKILL) };
        actor::next_death(&counter, &mut seen).await.unwrap()
    };
    let (in_flight, death) = futures::join!(in_flight, kill);
    assert!(in_flight.is_err(), "a call in flight fails: {in_flight:?}");
    assert_eq!(death.reason, DeathCause::Killed { signal: 9 });
    assert!(death.restarting);

    // The restarted incarnation starts from its constructor arguments.
    let value = counter.send(Add(1)).await.unwrap();
    assert_eq!(value, 1);
    let second = counter.record().await.unwrap();
    assert_ne!(second.incarnation, first.incarnation);
    assert_eq!(second.restarts, 1);

    // No restarts left: the next death is final.
    // SAFETY: kill() has no memory-safety preconditions.
    unsafe { libc::kill(worker_pid(counter.id()), libc::SIGKILL) };
    let death = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(!death.restarting);
    let err = counter.send(Add(1)).await.unwrap_err();
    assert!(matches!(err, CallError::ActorDead { .. }), "{err}");

    // The monitoring actor was told of both deaths, the last one final.
    let first = deaths.recv().await.unwrap();
    assert_eq!(
        (first.reason.clone(), first.restarting),
        (DeathCause::Killed { signal: 9 }, true)
    );
    let last = deaths.recv().await.unwrap();
    assert_eq!(
        (last.reason.clone(), last.restarting),
        (DeathCause::Killed { signal: 9 }, false)
    );
}

async fn a_handler_panic_kills_only_its_actor() {
    let victim = actor::spawn::<Counter>(0, on("node-1").max_restarts(1))
        .await
        .unwrap();
    let bystander = actor::spawn::<Counter>(40, on("node-1")).await.unwrap();
    let mut seen = 0;
    let err = victim
        .send(Boom("boom in a handler".into()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Handler { message, .. } if message.contains("boom in a handler"))
            || matches!(&err, CallError::ActorDead { .. }),
        "{err}"
    );
    let death = actor::next_death(&victim, &mut seen).await.unwrap();
    assert_eq!(
        death.reason,
        DeathCause::Panicked {
            message: "boom in a handler".into()
        }
    );
    assert!(death.restarting);
    assert_eq!(bystander.send(Add(2)).await.unwrap(), 42);
    assert_eq!(victim.send(Add(3)).await.unwrap(), 3);
}

async fn an_unknown_message_type_is_a_clear_error() {
    let counter = actor::spawn::<Counter>(9, on("node-2")).await.unwrap();
    let err = counter.send(Stray).await.unwrap_err();
    match err {
        CallError::Decode { detail, .. } => assert!(detail.contains("tests.Stray"), "{detail}"),
        other => panic!("expected a decode error, got {other}"),
    }
    assert_eq!(counter.send(Add(1)).await.unwrap(), 10);
}

/// Spawns in quick succession see each other: a node reports its new use
/// to the head before the spawner hears the actor started, so `Spread`
/// alternates between two equal nodes instead of piling onto the one the
/// head last saw empty.
async fn spread_spawns_in_quick_succession_alternate(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let mut lanes = Vec::new();
    for _ in 0..2 {
        let args = ["--num-cpus", "2", "--resources", r#"{"lane": 8}"#];
        let index = cluster.add_node(&args).unwrap();
        lanes.push(cluster.node(index).unwrap().name().to_string());
    }
    let mut placed = std::collections::BTreeMap::<String, usize>::new();
    let mut counters = Vec::new();
    for _ in 0..4 {
        let options = SpawnOptions::default()
            .num_cpus(0.5)
            .resource("lane", 1.0)
            .strategy(Strategy::Spread);
        let counter = actor::spawn::<Counter>(0, options).await.unwrap();
        *placed
            .entry(counter.record().await.unwrap().node.name)
            .or_default() += 1;
        counters.push(counter);
    }
    assert_eq!(placed.len(), 2, "both lanes used: {placed:?}");
    assert!(placed.values().all(|n| *n == 2), "{placed:?}");
    for counter in counters {
        counter.kill().await.unwrap();
    }
}

/// An actor with restarts left, not pinned to its node, is started again
/// on another node when its node is lost: the head ships the program there
/// from a node that has it (each spot node has a state directory, so a
/// binary cache, of its own). Once out of restarts, it dies with its node.
async fn actors_of_a_lost_node_restart_on_another_node(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let homes = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut spots = Vec::new();
    for home in &homes {
        let env = [("NIMBUS_HOME", home.path().display().to_string())];
        let index = cluster
            .add_node_with_env(&["--resources", r#"{"spot": 1}"#], &env)
            .unwrap();
        spots.push(cluster.node(index).unwrap().name().to_string());
    }
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("spot", 1.0)
        .max_restarts(1);
    let counter = actor::spawn::<Counter>(0, options).await.unwrap();
    assert_eq!(counter.send(Add(5)).await.unwrap(), 5);
    let first = counter.record().await.unwrap();
    let mut seen = 0;
    let cluster = driver.local_cluster().unwrap();
    cluster.kill(node_index(cluster, &first.node.name)).unwrap();
    let death = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(death.restarting, "{death:?}");
    assert!(death.reason.is_node_lost(), "{}", death.reason);
    // A restarted actor starts from its arguments (state is not migrated).
    assert_eq!(counter.send(Add(1)).await.unwrap(), 1);
    let second = counter.record().await.unwrap();
    assert_ne!(second.node.name, first.node.name);
    assert!(spots.contains(&second.node.name), "{second:?}");
    assert_eq!(second.restarts, 1);

    let cluster = driver.local_cluster().unwrap();
    cluster
        .kill(node_index(cluster, &second.node.name))
        .unwrap();
    let death = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(!death.restarting, "out of restarts: {death:?}");
    let err = counter.send(Add(1)).await.unwrap_err();
    assert!(matches!(err, CallError::NodeLost { .. }), "{err}");
}

/// An actor lost with its node that no other node can take (it needs a
/// resource only that node had) is declared dead, saying why.
async fn a_lost_actor_no_node_can_take_dies_saying_why(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster
        .add_node(&["--resources", r#"{"unique": 1}"#])
        .unwrap();
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("unique", 1.0)
        .max_restarts(3);
    let counter = actor::spawn::<Counter>(0, options).await.unwrap();
    let mut seen = 0;
    driver.local_cluster().unwrap().kill(index).unwrap();
    let first = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(first.restarting, "{first:?}");
    let last = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(!last.restarting, "{last:?}");
    assert!(
        matches!(&last.reason, DeathCause::NotRescheduled { death, error }
            if death.is_node_lost() && error.contains("unique")),
        "{}",
        last.reason
    );
}

/// Killing an actor while the head restarts it on another node kills the
/// new incarnation: it stays dead.
async fn killing_an_actor_being_restarted_elsewhere_keeps_it_dead(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    for _ in 0..2 {
        let index = cluster
            .add_node(&["--resources", r#"{"refuge": 1}"#])
            .unwrap();
        assert!(cluster.node(index).is_ok());
    }
    let options = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("refuge", 1.0)
        .max_restarts(1);
    let counter = actor::spawn::<Counter>(0, options).await.unwrap();
    let first = counter.record().await.unwrap();
    let cluster = driver.local_cluster().unwrap();
    let index = node_index(cluster, &first.node.name);
    cluster.kill(index).unwrap();
    let mut seen = 0;
    let death = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(death.restarting, "{death:?}");
    counter.kill().await.unwrap();
    // Dead for good: no incarnation comes back to answer.
    match counter.record().await {
        Err(CallError::ActorDead { reason, .. }) => {
            assert!(reason.starts_with("killed on request"), "{reason:?}")
        }
        other => panic!("expected the actor dead, got {other:?}"),
    }
    let err = counter.send(Add(1)).await.unwrap_err();
    assert!(matches!(err, CallError::ActorDead { .. }), "{err}");
}

/// An actor pinned to its node (`Strategy::Node`) dies with it, restarts
/// left or not.
async fn actors_of_a_lost_node_are_reported_dead(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let doomed = cluster.add_node(&[]).unwrap();
    let name = cluster.node(doomed).unwrap().name().to_string();
    let counter = actor::spawn::<Counter>(0, on(&name).max_restarts(3))
        .await
        .unwrap();
    assert_eq!(counter.send(Add(1)).await.unwrap(), 1);
    let mut seen = 0;
    driver.local_cluster().unwrap().kill(doomed).unwrap();
    let death = actor::next_death(&counter, &mut seen).await.unwrap();
    assert!(!death.restarting, "{death:?}");
    assert!(death.reason.is_node_lost(), "{}", death.reason);
    let err = counter.send(Add(1)).await.unwrap_err();
    assert!(matches!(err, CallError::NodeLost { .. }), "{err}");
}

/// A node stopped on purpose (SIGTERM, as `nimbus stop` sends) takes its
/// actors with it as a lost node does: an actor pinned there is dead with
/// the cause, its name is free again, and a movable one restarts on
/// another node. (Before, a leave left them listed alive for ever.)
async fn actors_of_a_node_that_left_are_dead_or_restarted(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let mut leavers = Vec::new();
    for _ in 0..2 {
        let index = cluster
            .add_node(&["--resources", r#"{"leaving": 1}"#])
            .unwrap();
        leavers.push(cluster.node(index).unwrap().name().to_string());
    }
    let movable = SpawnOptions::default()
        .num_cpus(0.1)
        .resource("leaving", 1.0)
        .max_restarts(1);
    let counter = actor::spawn::<Counter>(0, movable).await.unwrap();
    let first = counter.record().await.unwrap();
    let pinned = actor::spawn::<Counter>(0, on(&first.node.name).name("left-behind"))
        .await
        .unwrap();
    assert_eq!(pinned.send(Add(1)).await.unwrap(), 1);
    let cluster = driver.local_cluster().unwrap();
    let index = node_index(cluster, &first.node.name);
    assert!(
        cluster.stop(index, Duration::from_secs(10)).unwrap(),
        "the node exits cleanly on SIGTERM"
    );
    let within = Duration::from_secs(20);
    let mut seen = 0;
    let death = tokio::time::timeout(within, actor::next_death(&pinned, &mut seen))
        .await
        .expect("the pinned actor's death is recorded")
        .unwrap();
    assert!(!death.restarting, "{death:?}");
    assert!(death.reason.is_node_lost(), "{}", death.reason);
    assert!(
        death.reason.to_string().contains("left"),
        "{}",
        death.reason
    );
    let name = actor::get_actor::<Counter>("left-behind").await.unwrap();
    assert!(name.is_none(), "the name is free again");
    let mut seen = 0;
    let death = tokio::time::timeout(within, actor::next_death(&counter, &mut seen))
        .await
        .expect("the movable actor's death is recorded")
        .unwrap();
    assert!(death.restarting, "{death:?}");
    assert_eq!(counter.send(Add(2)).await.unwrap(), 2);
    let second = counter.record().await.unwrap();
    assert_ne!(second.node.name, first.node.name);
    assert!(leavers.contains(&second.node.name), "{second:?}");
}

/// The second driver's part: joins with `NIMBUS_ADDRESS`/`NIMBUS_TOKEN`,
/// finds the first driver's named actor and spawns one of its own.
/// A driver that spawns two actors (0.5 CPU each), a detached one (0.1
/// CPU), a placement group (one 0.5-CPU bundle) and an object, says
/// `ready OBJECT`, and waits to be killed.
pub fn orphan_driver() {
    let driver = nimbus::init(registry()).expect("joins the cluster by address");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let mut kept = Vec::new();
        for i in 0..2 {
            let options = on("node-1").num_cpus(0.5).name(format!("orphan-{i}"));
            kept.push(actor::spawn::<Counter>(0, options).await.unwrap());
        }
        let survivor = on("node-1").name("survivor").detached().shared();
        kept.push(actor::spawn::<Counter>(0, survivor).await.unwrap());
        let group = PlacementGroup::create(
            vec![cpus(0.5)],
            PlacementStrategy::Pack,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        // A small object (its node's small reads) and a larger one (its
        // shard, its shared-memory file).
        let object = object_store::put(&vec![7u8; 1024]).await.unwrap();
        let large = object_store::put(&vec![8u8; 1 << 20]).await.unwrap();
        object_store::flush().await;
        let pending = referenced_before_it_exists().await;
        // What a collective of this job would share on this host.
        let segment = nimbus::library::job_shared_memory().join(SEGMENT);
        std::fs::write(&segment, b"this job's gradients").unwrap();
        println!("ready {} {} {pending}", object.id(), large.id());
        std::future::pending::<()>().await;
        drop((kept, group, object, large));
    });
}

/// An object id this driver holds on its node before any object has it,
/// as a task's result is held from its submission on: a placeholder of
/// this driver's job there.
async fn referenced_before_it_exists() -> nimbus::cluster::ObjectId {
    use nimbus::cluster::{ObjectId, ObjectRequest, RefChange, RefHolder, RefUpdate};
    let context = actor::ProcessContext::current().unwrap();
    let id = ObjectId(rand::random());
    let holder = RefHolder::Process {
        id: rand::random(),
        label: "the orphan driver's pending result".into(),
        worker: None,
        job: Some(context.job.clone()),
    };
    let hold = ObjectRequest::UpdateRefs {
        holder,
        updates: vec![RefUpdate {
            id,
            change: RefChange::Hold { arrived: false },
        }],
    };
    let home = context.endpoint.connect(context.home, None).await.unwrap();
    let options = nimbus::transport::RequestOptions::control();
    nimbus::client::call(&home, hold, options).await.unwrap();
    id
}

/// The head survives its own restart (`nimbus::head::store`), run by a
/// driver with a cluster of its own ([`head_restart_driver`]): with the
/// head SIGKILLed, calls between actors and from the driver go on, an
/// object put on one member is read on another, and a
/// lookup, a spawn and a placement group wait for it; the head started
/// again takes its members back and knows the same actors by the same
/// names (same incarnations, no restart, state kept), keeps the members'
/// bundles, learns the death its member could not report, tells a reader
/// from before that it missed events (which finds the death it missed),
/// and declares the member that did not come back dead after the grace,
/// its movable actor restarted elsewhere, and keeps the library records
/// a driver and a worker set (`nimbus::library::Records`).
async fn a_restarted_head_keeps_its_members_and_actors() {
    own_cluster_driver(&[
        (crate::HEAD_RESTART_DRIVER, "1".into()),
        ("NIMBUS_HEAD_GRACE_S", "10".into()),
    ])
    .await;
}

/// Runs this binary as a driver with a cluster of its own, with `env`
/// (which says what it does), and prints its summary line; fails if it
/// fails.
async fn own_cluster_driver(env: &[(&str, String)]) {
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().map(|(key, value)| (key, value)))
        .env_remove("NIMBUS_ADDRESS")
        .env_remove("NIMBUS_TOKEN")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary = stdout.lines().find(|l| l.starts_with("summary: "));
    println!(
        "{}",
        summary.unwrap_or_else(|| panic!("{stdout}\n{stderr}"))
    );
}

/// Tickets expire (`--ticket-lifetime-s`, 4 s here) and are renewed
/// half-way through, and the head's key is rotated under way: for three
/// lifetimes an actor started first meets a new actor on another node
/// every half second, each meeting a new connection between the two
/// workers, on which each checks the other's ticket. Without renewal the
/// first meeting after 4 s is refused (the first actor's ticket has
/// expired, and so has every node's); without the new key handed out with
/// renewals, the first one after the switch.
async fn tickets_are_renewed_before_they_expire() {
    own_cluster_driver(&[
        (crate::TICKET_RENEWAL_DRIVER, "1".into()),
        (
            "NIMBUS_TICKET_LIFETIME_S",
            TICKET_LIFETIME.as_secs().to_string(),
        ),
    ])
    .await;
}

/// The ticket lifetime of [`tickets_are_renewed_before_they_expire`]'s
/// cluster.
const TICKET_LIFETIME: Duration = Duration::from_secs(4);

/// [`tickets_are_renewed_before_they_expire`]' driver.
pub fn ticket_renewal_driver() {
    let mut driver = nimbus::init_with(registry(), nimbus::InitOptions::private(3))
        .expect("a private local cluster starts");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let first = actor::spawn::<Partner>((), on("node-2")).await.unwrap();
        let client = driver
            .local_cluster()
            .expect("a local cluster")
            .client()
            .await
            .unwrap();
        let (switch_at, done_at) = client.rotate_ticket_key().await.unwrap();
        let again = client.rotate_ticket_key().await.unwrap_err().to_string();
        assert!(
            again.contains("a rotation of the ticket key is under way"),
            "{again}"
        );
        let started = Instant::now();
        let mut met = 0;
        while started.elapsed() < 3 * TICKET_LIFETIME {
            let node = if met % 2 == 0 { "node-1" } else { "head" };
            let new = actor::spawn::<Counter>(met, on(node)).await.unwrap();
            let seconds = started.elapsed().as_secs_f64();
            let meeting = first.send(Meet(new.clone())).await.unwrap();
            assert_eq!(
                meeting,
                Ok(met),
                "meeting {met} on {node}, {seconds:.1} s in"
            );
            new.kill().await.unwrap();
            met += 1;
            // Paced, not waited on: the meetings spread over the lifetimes.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let now = nimbus::transport::unix_now();
        assert!(
            now > done_at,
            "the rotation was done {done_at} before the last meeting {now}"
        );
        let status = client.status().await.unwrap();
        assert_eq!(status.alive().count(), 3, "{status:?}");
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "summary: meetings={met} seconds={seconds:.1} switch_at={switch_at} done_at={done_at}"
        );
    });
}

/// [`a_restarted_head_keeps_its_members_and_actors`]' driver.
pub fn head_restart_driver() {
    let mut driver = nimbus::init_with(registry(), nimbus::InitOptions::private(3))
        .expect("a private local cluster starts");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let a = actor::spawn::<Counter>(10, on("node-1").name("kept-a"))
            .await
            .unwrap();
        let b = actor::spawn::<Counter>(20, on("node-2").name("kept-b"))
            .await
            .unwrap();
        let options = on("node-2").name("kept-partner");
        let partner = actor::spawn::<Partner>((), options).await.unwrap();
        assert_eq!(partner.send(Meet(a.clone())).await.unwrap(), Ok(10));
        // Each handle finds its actor's worker (at the head) on first use.
        assert_eq!(a.send(Add(0)).await.unwrap(), 10);
        assert_eq!(b.send(Add(0)).await.unwrap(), 20);
        let group = PlacementGroup::create(
            vec![cpus(0.2), cpus(0.2)],
            PlacementStrategy::Spread,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        let names = ["kept-a", "kept-b", "kept-partner"];
        let cluster = driver.local_cluster().expect("a local cluster");
        // A member that will not come back, with the most room: a movable
        // actor goes there first, and elsewhere once it is declared dead.
        let lost = cluster.add_node(&["--num-cpus", "16"]).unwrap();
        let client = cluster.client().await.unwrap();
        let lost_name = cluster.node(lost).unwrap().name().to_string();
        client
            .wait_for_status("the extra member", Duration::from_secs(30), |s| {
                s.alive().any(|n| n.id == lost_name)
            })
            .await
            .unwrap();
        let movable = SpawnOptions::default().num_cpus(0.1).max_restarts(1);
        let wanderer = actor::spawn::<Counter>(30, movable).await.unwrap();
        assert_eq!(wanderer.record().await.unwrap().node.name, lost_name);
        let mut before = Vec::new();
        for name in names {
            before.push(client.find_actor(name).await.unwrap().unwrap());
        }
        let members = client.status().await.unwrap();
        // An object on node-1, to be read on node-2 while the head is away.
        let writer = actor::spawn::<Reader>((), on("node-1")).await.unwrap();
        let reader = actor::spawn::<Reader>((), on("node-2")).await.unwrap();
        let put = |numbers: Vec<u64>| writer.send(PutNumbers(numbers));
        let first = put((1..=10).collect()).await.unwrap().unwrap();
        let object = put((1..=1000).collect()).await.unwrap().unwrap();
        // Each handle finds its actor's worker (at the head) on first use.
        assert_eq!(reader.send(SumObject(first)).await.unwrap(), Ok(55));
        // A death the old head publishes that this driver has not read when
        // the head dies: its events are gone with it.
        let doomed = actor::spawn::<Counter>(0, on("node-1").name("doomed"))
            .await
            .unwrap();
        let mut unread = client.last_event_seq().await.unwrap();
        doomed.kill().await.unwrap();
        let dies_in_outage = actor::spawn::<Counter>(0, on("node-2").name("dies-in-outage"))
            .await
            .unwrap();
        let mut before_outage = client.last_event_seq().await.unwrap();
        // Library records, from the driver and from a worker of its job.
        let records = nimbus::library::Records::of_this_job("tests").unwrap();
        records.put("deployment/a", b"replicas=2").await.unwrap();
        records.put("deployment/b", b"replicas=1").await.unwrap();
        assert!(records.delete("deployment/b").await.unwrap());
        let kept = KeepRecord("deployment/w".into(), b"from a worker".to_vec());
        a.send(kept).await.unwrap().unwrap();
        drop(client);

        cluster.kill(0).unwrap();
        cluster.kill(lost).unwrap();
        // A death the head cannot be told of now: its node tells the
        // restarted head.
        // SAFETY: kill() has no memory-safety preconditions.
        unsafe { libc::kill(worker_pid(dies_in_outage.id()), libc::SIGKILL) };
        // No head: calls between processes that know each other go on.
        let outage = Instant::now();
        assert_eq!(a.send(Add(1)).await.unwrap(), 11);
        assert_eq!(partner.send(AddToPeer(1)).await.unwrap(), Ok(12));
        assert_eq!(b.send(Add(2)).await.unwrap(), 22);
        // Node to node, an object moves without the head.
        let sum = reader.send(SumObject(object.clone())).await.unwrap();
        assert_eq!(sum, Ok(500_500));
        let calls_in_outage = outage.elapsed();
        // What needs the head waits for it instead of failing.
        let lookup = tokio::task::spawn_local(actor::get_actor::<Counter>("kept-b"));
        let movable = SpawnOptions::default()
            .num_cpus(0.1)
            .max_restarts(1)
            .name("born-in-outage");
        let born = tokio::task::spawn_local(actor::spawn::<Counter>(5, movable));
        let grouped = tokio::task::spawn_local(PlacementGroup::create(
            vec![cpus(0.1)],
            PlacementStrategy::Pack,
            Duration::from_secs(30),
        ));
        tokio::task::yield_now().await;

        let restarted = Instant::now();
        cluster.restart(0).unwrap();
        let client = cluster.client().await.unwrap();
        let back = client
            .wait_for_status("the members back", Duration::from_secs(30), |s| {
                ["node-1", "node-2"].iter().all(|name| {
                    s.node(name)
                        .is_some_and(|n| n.state == NodeState::Alive && !n.rejoining)
                })
            })
            .await
            .unwrap();
        let members_back = restarted.elapsed();
        for name in ["node-1", "node-2"] {
            let (was, is) = (members.node(name).unwrap(), back.node(name).unwrap());
            assert_eq!(was.incarnation, is.incarnation, "{name} restarted");
        }
        for (name, was) in names.iter().zip(&before) {
            let is = client.find_actor(name).await.unwrap();
            let is = is.unwrap_or_else(|| panic!("{name} is unknown to the restarted head"));
            assert_eq!(
                (
                    is.actor,
                    is.incarnation,
                    is.pid,
                    is.restarts,
                    &is.dead,
                    is.restarting
                ),
                (was.actor, was.incarnation, was.pid, 0, &None, false),
                "{name}"
            );
        }
        // The placement group's bundles on members are still reserved
        // (their nodes keep them; one on the head died with it).
        let on_members: Vec<usize> = (0..group.len())
            .filter(|i| group.node(*i).unwrap() != "head")
            .collect();
        assert!(!on_members.is_empty(), "spread over 3 nodes, 2 bundles");
        for index in on_members {
            let node = back.node(group.node(index).unwrap()).unwrap();
            let bundles = client.bundles(node).await.unwrap();
            let bundle = group.bundle(index).unwrap();
            assert!(
                bundles.iter().any(|b| b.bundle == bundle),
                "bundle {index} of the group is gone from {}",
                node.id
            );
        }
        group.remove().await.unwrap();
        // The library records as they were, deletion included.
        let keys = records.keys("deployment/").await.unwrap();
        assert_eq!(keys, ["deployment/a", "deployment/w"]);
        let value = records.get("deployment/w").await.unwrap();
        assert_eq!(value.as_deref(), Some(&b"from a worker"[..]));
        let waited = lookup.await.unwrap().unwrap().expect("kept-b found");
        assert_eq!(waited.send(Add(0)).await.unwrap(), 22);
        let born = born.await.unwrap().expect("a spawn waits for the head");
        assert_eq!(born.send(Add(1)).await.unwrap(), 6);
        let grouped = grouped.await.unwrap().expect("a placement waits for the head");
        grouped.remove().await.unwrap();
        // The stream says events were missed, and a death watch that kept
        // its place from before still learns of the death it missed.
        let missed = client.events(unread, Duration::ZERO).await.unwrap();
        assert!(
            matches!(missed[0].kind, ClusterEventKind::Resync { after, .. } if after == unread),
            "{missed:?}"
        );
        let death = death_within_30s(&doomed, &mut unread, "the missed death").await;
        assert!(!death.restarting, "{death:?}");
        let death = death_within_30s(&dies_in_outage, &mut before_outage, "the outage's death").await;
        assert_eq!(death.reason, DeathCause::Killed { signal: 9 });
        // The member that did not come back is declared dead after the
        // grace, and its movable actor starts elsewhere (a new incarnation
        // starts from its spawn arguments).
        let gone = client
            .wait_for_status("the lost member declared dead", Duration::from_secs(30), |s| {
                s.node(&lost_name).is_some_and(|n| n.state == NodeState::Dead)
            })
            .await
            .unwrap();
        let why = gone.node(&lost_name).unwrap().death_reason.clone().unwrap();
        assert!(why.contains("did not come back within"), "{why}");
        assert_eq!(wanderer.send(Add(1)).await.unwrap(), 31);
        let moved = wanderer.record().await.unwrap();
        assert_ne!(moved.node.name, lost_name);
        assert_eq!(moved.restarts, 1);
        // The same actors, state and all: by name, and through old handles.
        let by_name = actor::get_actor::<Counter>("kept-a")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(by_name.send(Add(1)).await.unwrap(), 13);
        assert_eq!(partner.send(AddToPeer(1)).await.unwrap(), Ok(14));
        println!(
            "summary: calls_in_outage_ms={} members_back_ms={} actors_kept={} missed_death_found=true",
            calls_in_outage.as_millis(),
            members_back.as_millis(),
            names.len()
        );
    });
}

/// The next death of `handle`'s actor after event `after`, within 30 s.
async fn death_within_30s(
    handle: &nimbus::actor::ActorHandle<Counter>,
    after: &mut u64,
    what: &str,
) -> actor::ActorDied {
    tokio::time::timeout(Duration::from_secs(30), actor::next_death(handle, after))
        .await
        .unwrap_or_else(|_| panic!("{what} is not seen within 30 s"))
        .unwrap()
}

/// A driver whose actor on node-1 prints a line; it waits to be killed.
pub fn printing_driver() {
    let driver = nimbus::init(registry()).expect("joins the cluster by address");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let shouter = actor::spawn::<Counter>(0, on("node-1").name("shouter"))
            .await
            .unwrap();
        shouter
            .send(Print("shouting from node-1".into()))
            .await
            .unwrap();
        shouter
            .send(Trace("tracing from node-1".into()))
            .await
            .unwrap();
        std::future::pending::<()>().await;
        drop(shouter);
    });
}

pub fn remote_driver() {
    let driver = nimbus::init(registry()).expect("joins the cluster by address");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let shared = actor::get_actor::<Counter>("shared-counter")
            .await
            .unwrap()
            .unwrap();
        let seen = shared.send(Add(1)).await.unwrap();
        let own = actor::spawn::<Counter>(100, SpawnOptions::default().num_cpus(0.1))
            .await
            .unwrap();
        let mine = own.send(Add(1)).await.unwrap();
        println!("remote driver ok: shared={seen} own={mine}");
    });
}

async fn a_second_driver_joins_by_address(driver: &mut Driver) {
    let shared = actor::spawn::<Counter>(41, on("node-1").name("shared-counter"))
        .await
        .unwrap();
    let cluster = driver.local_cluster().expect("a local cluster");
    let child = second_driver(cluster, crate::REMOTE_DRIVER).output();
    let output = tokio::time::timeout(Duration::from_secs(60), child)
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("remote driver ok: shared=42 own=101"),
        "{stdout}"
    );
    assert_eq!(shared.send(Add(0)).await.unwrap(), 42);
}

async fn injected_actor_faults_fire_at_their_message_count(driver: &mut Driver) {
    let rules = vec![
        ActorFault {
            actor_name: None,
            actor_type: Some("tests.Sequencer".into()),
            message: Some("tests.Push".into()),
            after_messages: 100,
            action: ActorFaultAction::Kill,
        },
        ActorFault {
            actor_name: Some("panicky".into()),
            actor_type: None,
            message: None,
            after_messages: 3,
            action: ActorFaultAction::Panic,
        },
    ];
    let env = [(ACTOR_FAULTS_ENV, serde_json::to_string(&rules).unwrap())];
    let cluster = driver.local_cluster().expect("a local cluster");
    let faulty = cluster.add_node_with_env(&[], &env).unwrap();
    let node = cluster.node(faulty).unwrap().name().to_string();

    let sequencer = actor::spawn::<Sequencer>((), on(&node).max_restarts(1))
        .await
        .unwrap();
    let mut seen = 0;
    for n in 0..99 {
        sequencer.do_send(Push(n)).unwrap();
    }
    assert!(
        sequencer.send(Push(99)).await.is_err(),
        "the 100th push kills the actor"
    );
    let death = actor::next_death(&sequencer, &mut seen).await.unwrap();
    assert_eq!(
        death.reason,
        DeathCause::ChaosFault(FiredFault::new(
            "kill",
            "message 100 (tests.Push)",
            "tests.Sequencer"
        ))
    );
    assert!(death.restarting);
    // The restarted incarnation is not killed again by the same rule.
    for n in 0..200 {
        sequencer.do_send(Push(n)).unwrap();
    }
    assert_eq!(sequencer.send(Seen).await.unwrap(), (200, 0));

    let panicky = actor::spawn::<Counter>(0, on(&node).name("panicky"))
        .await
        .unwrap();
    let mut seen = 0;
    assert_eq!(panicky.send(Add(1)).await.unwrap(), 1);
    assert_eq!(panicky.send(Add(1)).await.unwrap(), 2);
    assert!(panicky.send(Add(1)).await.is_err());
    let death = actor::next_death(&panicky, &mut seen).await.unwrap();
    assert_eq!(
        death.reason,
        DeathCause::Panicked {
            message: "chaos: panic at message 3 (tests.Add) of panicky".into()
        }
    );
    assert!(!death.restarting);
}

/// The workload of `nimbus chaos run`: a sequencer fed 300 numbers, which
/// the plan kills at its 100th; it must come back and take the rest.
pub fn chaos_workload() {
    let driver = nimbus::init(registry()).expect("joins the chaos cluster");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let options = SpawnOptions::default().num_cpus(0.1).max_restarts(1);
        let sequencer = actor::spawn::<Sequencer>((), options).await.unwrap();
        let mut failed = 0;
        for n in 0..300 {
            if sequencer.send(Push(n)).await.is_err() {
                failed += 1;
            }
        }
        let (seen, _) = sequencer.send(Seen).await.unwrap();
        println!("chaos workload: {failed} push failed, the restarted sequencer saw up to {seen}");
        assert_eq!(failed, 1, "only the push that triggered the fault fails");
        assert_eq!(seen, 300);
    });
}

async fn chaos_run_replays_actor_faults_by_message_count(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let (program, program_args) = (
        cluster.program().to_path_buf(),
        cluster.program_args().to_vec(),
    );
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.toml");
    std::fs::write(
        &plan,
        r#"
seed = 3
[[faults]]
at_ms = 100
action = { stop_node = { node = "random", for_ms = 300 } }
[[actor_faults]]
actor_type = "tests.Sequencer"
message = "tests.Push"
after_messages = 100
action = "kill"
"#,
    )
    .unwrap();
    let mut injected = Vec::new();
    for _ in 0..2 {
        let run = tokio::process::Command::new(&program)
            .args(&program_args)
            .args(["chaos", "run", plan.to_str().unwrap(), "--nodes", "3", "--"])
            .arg(std::env::current_exe().unwrap())
            .env(crate::CHAOS_WORKLOAD, "1")
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .unwrap()
            .unwrap();
        let out = String::from_utf8_lossy(&output.stdout).to_string();
        assert!(
            output.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            out.contains("kill target=tests.Sequencer trigger=message 100 (tests.Push)"),
            "{out}"
        );
        assert!(out.contains(": actor restarted on "), "{out}");
        // `fault <n> t=<seconds> <kind> target=<name> trigger=<...>`: the
        // same in both runs but for the time.
        let lines: Vec<String> = out
            .lines()
            .filter(|l| l.starts_with("fault "))
            .map(|l| {
                l.split(' ')
                    .filter(|word| !word.starts_with("t="))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        injected.push(lines);
    }
    assert_eq!(injected[0], injected[1]);
    assert_eq!(injected[0].len(), 2, "{:?}", injected[0]);
}

async fn objects_put_here_are_read_on_other_nodes(driver: &mut Driver) {
    let numbers: Vec<u64> = (0..100_000).collect();
    let object = object_store::put(&numbers).await.unwrap();
    let expected: u64 = numbers.iter().sum();
    for node in ["node-1", "node-2"] {
        let reader = actor::spawn::<Reader>((), on(node)).await.unwrap();
        assert_eq!(
            reader.send(SumObject(object.clone())).await.unwrap(),
            Ok(expected)
        );
    }
    // A large object, byte-exact across nodes; node-1 pulls it once and
    // serves both of its readers from its copy. Made off the driver's
    // thread: blocking it for seconds (64 MiB in a debug build, under
    // load) let its connection to its node idle out (seen in CI).
    let (big, expected) = tokio::task::spawn_blocking(|| {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let big: Vec<u8> = (0..(64usize << 20))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let expected = (big.len() as u64, digest(&big));
        (big, expected)
    })
    .await
    .unwrap();
    let object = object_store::put_bytes(&big).await.unwrap();
    for _ in 0..2 {
        let reader = actor::spawn::<Reader>((), on("node-1")).await.unwrap();
        assert_eq!(
            reader.send(DigestBytes(object.clone())).await.unwrap(),
            Ok(expected)
        );
    }
    let cluster = driver.local_cluster().unwrap();
    let client = cluster.client().await.unwrap();
    let node = client
        .status()
        .await
        .unwrap()
        .node("node-1")
        .unwrap()
        .clone();
    let listing = client.objects(&node).await.unwrap();
    let copies = listing
        .objects
        .iter()
        .filter(|o| o.id == object.id())
        .count();
    assert_eq!(copies, 1, "{listing:?}");
}

async fn a_put_that_cannot_fit_fails_clearly(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let small = cluster
        .add_node(&["--object-store-memory", "1000000"])
        .unwrap();
    let node = cluster.node(small).unwrap().name().to_string();
    let reader = actor::spawn::<Reader>((), on(&node)).await.unwrap();
    assert_eq!(reader.send(PutBytes(500_000)).await.unwrap(), Ok(()));
    // With the first spilled to disk, only an object larger than the whole
    // store is refused.
    let refused = reader.send(PutBytes(1_200_000)).await.unwrap().unwrap_err();
    assert!(refused.contains("object store is full"), "{refused}");
    assert!(refused.contains("--object-store-memory"), "{refused}");
}

async fn a_named_actor_is_killed_at_a_planned_time(driver: &mut Driver) {
    use nimbus::chaos::{self, ChaosPlan, FaultAction, TimelineEntry};
    let victim = actor::spawn::<Counter>(5, on("node-1").name("victim").max_restarts(1))
        .await
        .unwrap();
    assert_eq!(victim.send(Add(1)).await.unwrap(), 6);
    let plan = ChaosPlan::new(4).at(
        Duration::from_millis(200),
        FaultAction::KillActor {
            actor: "victim".into(),
        },
    );
    let mut seen = 0;
    let workload = async {
        // The planned kill is the workload's only death; then the restarted
        // actor (from its constructor arguments) answers again.
        let death = actor::next_death(&victim, &mut seen).await.unwrap();
        assert_eq!(death.reason, DeathCause::Killed { signal: 9 });
        assert!(death.restarting);
        victim.send(Add(1)).await.unwrap()
    };
    let cluster = driver.local_cluster().expect("a local cluster");
    let (after_restart, timeline) = chaos::run_while(cluster, &plan, workload).await.unwrap();
    assert_eq!(after_restart, 6, "the new incarnation starts again from 5");
    println!("{timeline}");
    assert_eq!(timeline.missed(), Vec::<String>::new(), "{timeline}");
    assert_eq!(
        timeline.injected(),
        vec![("after=200ms", "kill_actor", "victim")]
    );
    assert!(
        timeline.entries.iter().any(
            |e| matches!(e, TimelineEntry::Recovered { what, node, .. } if what.starts_with("actor restarted on ") && node == "victim")
        ),
        "{timeline}"
    );
}

/// `type:TYPE` targets every live actor of the type, each named in the
/// timeline by its unique name.
async fn actors_of_a_type_are_killed_at_a_planned_time(driver: &mut Driver) {
    use nimbus::chaos::{self, ChaosPlan, FaultAction};
    let mut sequencers = Vec::new();
    for (name, node) in [("seq-a", "node-1"), ("seq-b", "node-2")] {
        let options = on(node).name(name).max_restarts(1);
        let sequencer = actor::spawn::<Sequencer>((), options).await.unwrap();
        sequencer.send(Push(0)).await.unwrap();
        sequencers.push(sequencer);
    }
    let plan = ChaosPlan::new(6).at(
        Duration::from_millis(200),
        FaultAction::KillActor {
            actor: "type:tests.Sequencer".into(),
        },
    );
    let workload = async {
        for sequencer in &sequencers {
            let mut seen = 0;
            let death = actor::next_death(sequencer, &mut seen).await.unwrap();
            assert!(death.restarting, "{death:?}");
            // The new incarnation starts from nothing and takes 0 again.
            sequencer.send(Push(0)).await.unwrap();
        }
    };
    let cluster = driver.local_cluster().expect("a local cluster");
    let ((), timeline) = chaos::run_while(cluster, &plan, workload).await.unwrap();
    println!("{timeline}");
    assert_eq!(timeline.missed(), Vec::<String>::new(), "{timeline}");
    let injected = timeline.injected();
    for name in ["seq-a", "seq-b"] {
        assert!(
            injected.contains(&("after=200ms", "kill_actor", name)),
            "{timeline}"
        );
    }
}

async fn a_named_actor_panics_at_a_planned_time(driver: &mut Driver) {
    use nimbus::chaos::{self, ChaosPlan, FaultAction};
    let victim = actor::spawn::<Counter>(5, on("node-2").name("panicky").max_restarts(1))
        .await
        .unwrap();
    assert_eq!(victim.send(Add(1)).await.unwrap(), 6);
    let plan = ChaosPlan::new(5).at(
        Duration::from_millis(200),
        FaultAction::PanicActor {
            actor: "panicky".into(),
        },
    );
    let mut seen = 0;
    let workload = async {
        let death = actor::next_death(&victim, &mut seen).await.unwrap();
        assert_eq!(
            death.reason,
            DeathCause::Panicked {
                message: "chaos: panic at after=200ms of panicky".into()
            }
        );
        assert!(death.restarting);
        victim.send(Add(1)).await.unwrap()
    };
    let cluster = driver.local_cluster().expect("a local cluster");
    let (after_restart, timeline) = chaos::run_while(cluster, &plan, workload).await.unwrap();
    assert_eq!(after_restart, 6, "the new incarnation starts again from 5");
    assert_eq!(timeline.missed(), Vec::<String>::new(), "{timeline}");
    assert_eq!(
        timeline.injected(),
        vec![("after=200ms", "panic", "panicky")]
    );
}

/// A node started with `CUDA_VISIBLE_DEVICES=5,6` hands out its devices
/// `5` and `6`; two half-GPU actors share one device; an actor without
/// GPUs sees none. Before, the first actor got device `0` (the node's pool
/// index), each half took a whole device, and a CPU actor saw all of them.
async fn actors_see_only_their_own_gpus_by_the_nodes_device_ids(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let gpu_node = cluster
        .add_node_with_env(
            &["--num-gpus", "2", "--resources", r#"{"gpu_node": 10}"#],
            &[("CUDA_VISIBLE_DEVICES", "5,6".into())],
        )
        .expect("a node with two GPUs joins");
    let name = cluster.node(gpu_node).unwrap().name().to_string();
    let on_it = |gpus: f64| {
        SpawnOptions::default()
            .num_cpus(0.1)
            .num_gpus(gpus)
            .resource("gpu_node", 1.0)
    };
    let mut seen = Vec::new();
    let mut actors = Vec::new();
    for gpus in [1.0, 0.5, 0.5, 0.0] {
        let counter = actor::spawn::<Counter>(0, on_it(gpus)).await.unwrap();
        assert_eq!(counter.record().await.unwrap().node.name, name);
        let visible = counter.send(EnvVar("CUDA_VISIBLE_DEVICES".into())).await;
        seen.push(visible.unwrap());
        actors.push(counter);
    }
    let expected = ["5", "6", "6", ""].map(|ids| Some(ids.to_string()));
    assert_eq!(seen, expected);
    // The halves filled device 6: another whole GPU is refused by name.
    let third = on_it(1.0).deadline(Duration::from_secs(2));
    match actor::spawn::<Counter>(0, third).await {
        Err(SpawnError::NoCapacity { last, .. }) => assert!(last.contains("GPU"), "{last}"),
        other => panic!(
            "a third whole GPU on a two-GPU node: {:?}",
            other.map(|a| a.id())
        ),
    }
    for counter in actors {
        counter.kill().await.unwrap();
    }
}

/// A panic message of megabytes (an `assert_eq!` on big vectors) is kept
/// cut to 4 KiB, so the head's event history stays readable and spawns
/// keep working. Before, three 6 MiB panics put 18 MiB in the history,
/// past the 16 MiB frame limit, and every read of the events failed.
async fn huge_panic_messages_leave_the_event_history_readable(driver: &mut Driver) {
    const SIZE: usize = 6 << 20;
    for _ in 0..3 {
        let victim = actor::spawn::<Counter>(0, on("node-1")).await.unwrap();
        let mut seen = 0;
        assert!(victim.send(BoomOfSize(SIZE)).await.is_err());
        let death = actor::next_death(&victim, &mut seen).await.unwrap();
        let message = death.reason.panic_message().expect("a panic");
        assert!(
            message.len() < nimbus::cluster::MAX_TEXT_BYTES + 64,
            "{} bytes kept",
            message.len()
        );
        assert!(
            message.contains("more bytes cut"),
            "{}",
            &message[message.len() - 64..]
        );
    }
    let cluster = driver.local_cluster().expect("a local cluster");
    let client = cluster.client().await.unwrap();
    let history = client.events(0, Duration::ZERO).await.unwrap();
    assert!(!history.is_empty());
    let counter = actor::spawn::<Counter>(1, on("node-1")).await.unwrap();
    assert_eq!(counter.send(Add(1)).await.unwrap(), 2);
    counter.kill().await.unwrap();
}
