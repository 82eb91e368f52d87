//! The tests, in the order they run.

use std::time::{Duration, Instant};

use nimbus::actor::{self, SpawnOptions, Strategy};
use nimbus::client::ClusterClient;
use nimbus::cluster::{
    ObjectId, ObjectListing, ObjectReply, ObjectRequest, ObjectState, RefChange, RefHolder,
    RefUpdate, ResourceSet, SmallObject,
};
use nimbus::object_store::{self, ObjectBytes, ObjectStoreError};
use nimbus::placement::{PlacementGroup, PlacementStrategy};
use nimbus::task::{self, Input, TaskError, TaskOptions};
use nimbus::testing::check::wait_until;
use nimbus::transport::RequestOptions;
use nimbus::Driver;

use crate::fixtures::*;
use crate::{boxed, Test};

pub const ALL: &[(&str, Test)] = &[
    ("an_object_is_freed_when_its_last_reference_drops", |d| {
        boxed(an_object_is_freed_when_its_last_reference_drops(d))
    }),
    (
        "large_objects_are_shared_memory_mapped_on_their_host",
        |d| boxed(large_objects_are_shared_memory_mapped(d)),
    ),
    ("a_freed_file_is_reused_only_if_no_process_mapped_it", |d| {
        boxed(a_freed_file_is_reused_only_if_no_process_mapped_it(d))
    }),
    ("a_file_streaming_out_when_freed_is_not_reused", |d| {
        boxed(a_file_streaming_out_when_freed_is_not_reused(d))
    }),
    (
        "memory_returns_to_baseline_after_10000_put_get_drop_cycles",
        |d| boxed(memory_returns_to_baseline(d)),
    ),
    ("a_reference_in_a_message_keeps_the_object_alive", |d| {
        boxed(a_reference_in_a_message_keeps_the_object_alive(d))
    }),
    ("a_killed_workers_references_are_released", |d| {
        boxed(a_killed_workers_references_are_released(d))
    }),
    (
        "references_inside_objects_live_as_long_as_the_object",
        |d| boxed(references_inside_objects_live_as_long_as_the_object(d)),
    ),
    ("a_256_mib_object_crosses_nodes_byte_exact", |_| {
        boxed(a_256_mib_object_crosses_nodes_byte_exact())
    }),
    (
        "objects_spill_to_disk_under_a_small_cap_and_come_back",
        |d| boxed(objects_spill_to_disk_and_come_back(d)),
    ),
    ("task_chains_and_map_reduce_pass_references", |_| {
        boxed(task_chains_and_map_reduce_pass_references())
    }),
    ("a_thousand_tasks_and_spilling_to_other_nodes", |d| {
        boxed(a_thousand_tasks_and_spilling_to_other_nodes(d))
    }),
    ("task_errors_and_panics_name_the_task", |_| {
        boxed(task_errors_and_panics_name_the_task())
    }),
    ("an_impossible_task_fails_fast", |_| {
        boxed(an_impossible_task_fails_fast())
    }),
    ("wait_then_a_task_retried_after_sigkill", |_| {
        boxed(wait_then_a_task_retried_after_sigkill())
    }),
    ("references_inside_task_results_keep_objects_alive", |d| {
        boxed(references_inside_task_results(d))
    }),
    ("tasks_run_in_placement_group_bundles", |_| {
        boxed(tasks_run_in_placement_group_bundles())
    }),
    (
        "tasks_in_flight_on_one_worker_run_one_at_a_time_past_a_panic_and_a_loss",
        |_| boxed(tasks_in_flight_on_one_worker()),
    ),
    ("an_object_lost_with_its_owner_node_fails_clearly", |d| {
        boxed(an_object_lost_with_its_owner_node_fails_clearly(d))
    }),
    (
        "a_put_that_stops_half_way_is_abandoned_and_frees_its_memory",
        |d| boxed(a_put_that_stops_half_way_is_abandoned(d)),
    ),
    ("a_small_dev_shm_keeps_large_objects_in_memory", |d| {
        boxed(a_small_dev_shm_keeps_large_objects_in_memory(d))
    }),
    ("a_late_put_of_a_freed_object_is_refused", |d| {
        boxed(a_late_put_of_a_freed_object_is_refused(d))
    }),
    ("a_small_object_is_read_until_it_is_freed", |d| {
        boxed(a_small_object_is_read_until_it_is_freed(d))
    }),
    ("a_small_object_read_last_is_not_spilled_first", |d| {
        boxed(a_small_object_read_last_is_not_spilled_first(d))
    }),
];

const SETTLE: Duration = Duration::from_secs(20);

fn on(node: &str) -> SpawnOptions {
    SpawnOptions::default()
        .num_cpus(0.1)
        .strategy(Strategy::Node(node.into()))
}

/// A client of the test cluster.
async fn client(driver: &mut Driver) -> ClusterClient {
    let cluster = driver.local_cluster().expect("a local cluster");
    cluster.client().await.unwrap()
}

/// The object listing of node `name`.
async fn listing(client: &ClusterClient, name: &str) -> ObjectListing {
    let status = client.status().await.unwrap();
    let node = status.node(name).expect("the node is known");
    client.objects(node).await.unwrap()
}

/// Waits until object `id` is gone from `node`'s store.
async fn wait_freed(client: &ClusterClient, node: &str, id: ObjectId) {
    let what = format!("object {id} is freed on {node}");
    let freed = wait_until(&what, SETTLE, || async {
        let now = listing(client, node).await;
        now.objects.iter().all(|o| o.id != id).then_some(())
    })
    .await;
    if let Err(e) = freed {
        panic!("{e}: {:?}", listing(client, node).await);
    }
}

/// Starts one more node with `args`; its name.
fn add_node(driver: &mut Driver, args: &[&str]) -> String {
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster.add_node(args).unwrap();
    cluster.node(index).unwrap().name().to_string()
}

/// A connection to node `name`'s object store, as a process of another
/// node has, for object requests sent as they are on the wire.
async fn store_of(client: &ClusterClient, name: &str) -> nimbus::transport::Connection {
    let status = client.status().await.unwrap();
    let node = status.node(name).expect("the node is known");
    client.connect_node(node).await.unwrap()
}

/// Sends object request `request` to the store at `node`.
async fn ask(
    node: &nimbus::transport::Connection,
    request: ObjectRequest,
) -> Result<ObjectReply, nimbus::client::ClientError> {
    nimbus::client::call(node, request, RequestOptions::bulk()).await
}

/// A put of object `id`, `bytes`, whole, held by `holder`.
fn put_whole(id: ObjectId, holder: &RefHolder, bytes: Vec<u8>) -> ObjectRequest {
    ObjectRequest::PutObjectChunk {
        id,
        offset: 0,
        total: bytes.len() as u64,
        holder: holder.clone(),
        contains: Vec::new(),
        chunk: bytes,
    }
}

/// Releases `holder`'s references to `ids` at the store at `node`.
async fn release_at(node: &nimbus::transport::Connection, holder: &RefHolder, ids: &[ObjectId]) {
    let updates = ids
        .iter()
        .map(|&id| RefUpdate {
            id,
            change: RefChange::Release,
        })
        .collect();
    let holder = holder.clone();
    ask(node, ObjectRequest::UpdateRefs { holder, updates })
        .await
        .unwrap();
}

/// A holder of references that is no process of the cluster, numbered.
fn test_holder(id: u64, label: &str) -> RefHolder {
    RefHolder::Process {
        id,
        label: label.into(),
        worker: None,
        job: None,
    }
}

async fn an_object_is_freed_when_its_last_reference_drops(driver: &mut Driver) {
    let client = client(driver).await;
    let object = object_store::put(&vec![1u64, 2, 3]).await.unwrap();
    let copy = object.clone();
    // Small: it reaches the store in the background.
    object_store::flush().await;
    let found = listing(&client, "head").await;
    let summary = found.objects.iter().find(|o| o.id == object.id()).unwrap();
    assert!(summary.primary);
    assert_eq!(summary.state, ObjectState::InMemory);
    assert_eq!(summary.holders.len(), 1, "{summary:?}");
    assert!(summary.holders[0].starts_with("driver pid"), "{summary:?}");
    drop(object);
    // A clone still holds it.
    assert_eq!(object_store::get(&copy).await.unwrap(), vec![1, 2, 3]);
    let id = copy.id();
    drop(copy);
    wait_freed(&client, "head", id).await;
}

async fn large_objects_are_shared_memory_mapped(driver: &mut Driver) {
    let client = client(driver).await;
    let bytes = pattern(9, 3 << 20);
    let object = object_store::put_bytes(&bytes).await.unwrap();
    // Other local users cannot read the head's shared-memory objects.
    let head_pid = driver.local_cluster().unwrap().node(0).unwrap().pid();
    assert_private(std::path::Path::new(&format!(
        "/dev/shm/nimbus-objects-{}/nimbus-head-{head_pid}",
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    )));
    let found = listing(&client, "head").await;
    let summary = found.objects.iter().find(|o| o.id == object.id()).unwrap();
    assert_eq!(summary.state, ObjectState::SharedMemory, "{summary:?}");
    let back = object_store::get_bytes(&object).await.unwrap();
    assert!(matches!(back, ObjectBytes::Mapped(_)), "{back:?}");
    assert_eq!(&back[..], &bytes[..]);
    // Written in place by the putter's own code (an encoder's output),
    // large and small.
    for len in [bytes.len(), 1000] {
        let written = object_store::put_bytes_with(len, |out| {
            assert_eq!(out.len(), len);
            out.copy_from_slice(&bytes[..len]);
        })
        .await
        .unwrap();
        assert_eq!(written.size(), Some(len as u64));
        let back = object_store::get_bytes(&written).await.unwrap();
        assert_eq!(&back[..], &bytes[..len]);
    }
    // Small objects stay in the node's memory, and the putting process
    // keeps a copy while it holds a reference.
    let small = object_store::put_bytes(&bytes[..1000]).await.unwrap();
    let back = object_store::get_bytes(&small).await.unwrap();
    assert!(matches!(back, ObjectBytes::Local(_)), "{back:?}");
    object_store::flush().await;
    let found = listing(&client, "head").await;
    let summary = found.objects.iter().find(|o| o.id == small.id()).unwrap();
    assert_eq!(summary.state, ObjectState::InMemory, "{summary:?}");
    let id = object.id();
    drop(object);
    wait_freed(&client, "head", id).await;
}

/// A freed large object's shared-memory file becomes a spare that the
/// next large put writes into; one that a process mapped is removed
/// instead, so that mapping keeps its bytes.
async fn a_freed_file_is_reused_only_if_no_process_mapped_it(driver: &mut Driver) {
    let client = client(driver).await;
    let size = 3 << 20;
    let spare_now = || async { listing(&client, "head").await.spare };
    let before = spare_now().await;
    // Never read: its file is kept when it is freed.
    let unread = object_store::put_bytes(&pattern(1, size)).await.unwrap();
    let id = unread.id();
    drop(unread);
    wait_freed(&client, "head", id).await;
    let expected = before + size as u64;
    let kept = wait_until("the freed file is a spare", SETTLE, || async {
        (spare_now().await == expected).then_some(())
    })
    .await;
    if let Err(e) = kept {
        panic!("{e}: {:?}", listing(&client, "head").await);
    }
    // The next put of that size writes into it, and reads back its own
    // bytes.
    let reusing = object_store::put_bytes(&pattern(2, size)).await.unwrap();
    assert_eq!(spare_now().await, before, "the spare was reused");
    let back = object_store::get_bytes(&reusing).await.unwrap();
    assert!(matches!(back, ObjectBytes::Mapped(_)), "{back:?}");
    assert_eq!(digest(&back), digest(&pattern(2, size)));
    // This one is mapped here (`back`): freed, its file is not kept, and
    // a put of the same size does not touch the mapping.
    let id = reusing.id();
    drop(reusing);
    wait_freed(&client, "head", id).await;
    assert_eq!(spare_now().await, before, "a mapped file is never a spare");
    let next = object_store::put_bytes(&pattern(3, size)).await.unwrap();
    assert_eq!(digest(&back), digest(&pattern(2, size)));
    let id = next.id();
    drop(next);
    wait_freed(&client, "head", id).await;
}

/// A bulk stream out reads the object's shared-memory file straight: an
/// object freed while it streams (too large to sit in the sockets'
/// buffers) leaves no spare, so the next put of its size gets a fresh
/// file and the stream carries the freed object's bytes to its end.
async fn a_file_streaming_out_when_freed_is_not_reused(driver: &mut Driver) {
    let client = client(driver).await;
    let size = 64 << 20;
    let spare_now = || async { listing(&client, "head").await.spare };
    let before = spare_now().await;
    let streamed = object_store::put_bytes(&pattern(4, size)).await.unwrap();
    let id = streamed.id();
    let head = store_of(&client, "head").await;
    let ask_stream = ObjectRequest::StreamObject {
        id,
        size: size as u64,
        copy_at: None,
    };
    let (port, ticket) = match ask(&head, ask_stream).await.unwrap() {
        ObjectReply::Stream { port, ticket } => (port, ticket),
        other => panic!("no stream granted: {other:?}"),
    };
    let status = client.status().await.unwrap();
    let head_ip = status.node("head").unwrap().address.ip();
    let at = std::net::SocketAddr::new(head_ip, port);
    let mut stream = client.endpoint().bulk_connect(at, ticket).await.unwrap();
    // The first MiB: the owner has opened the file.
    let (mut stream, first) = tokio::task::spawn_blocking(move || {
        let mut first = Vec::new();
        let read = stream.read_exact_into(&mut first, 1 << 20);
        (stream, read.map(|()| first))
    })
    .await
    .unwrap();
    let mut got = first.unwrap();
    drop(streamed);
    wait_freed(&client, "head", id).await;
    assert_eq!(
        spare_now().await,
        before,
        "a file streaming out became a spare"
    );
    let next = object_store::put_bytes(&pattern(5, size)).await.unwrap();
    let rest = tokio::task::spawn_blocking(move || {
        stream
            .read_exact_into(&mut got, size - (1 << 20))
            .map(|()| got)
    });
    let got = rest.await.unwrap().unwrap();
    assert!(
        digest(&got) == digest(&pattern(4, size)),
        "the stream carried other bytes than the object's"
    );
    let id = next.id();
    drop(next);
    wait_freed(&client, "head", id).await;
}

async fn memory_returns_to_baseline(driver: &mut Driver) {
    let client = client(driver).await;
    let payload = vec![7u8; 1024];
    let cycles = |range: std::ops::Range<u32>| {
        let payload = payload.clone();
        async move {
            for i in range {
                let object = object_store::put(&(i, payload.clone())).await.unwrap();
                let (back, bytes): (u32, Vec<u8>) = object_store::get(&object).await.unwrap();
                assert_eq!((back, bytes.len()), (i, 1024));
            }
        }
    };
    let before = listing(&client, "head").await;
    // Warm up (connections, buffers, the allocator), then measure.
    cycles(0..1_000).await;
    let (held, rss) = (object_store::held_here(), rss_bytes());
    cycles(0..10_000).await;
    // The driver's own tables and memory: no stake or small copy kept, and
    // not the 10 MB the objects weighed.
    assert_eq!(
        object_store::held_here(),
        held,
        "references left in the driver"
    );
    let grown = rss_bytes().saturating_sub(rss);
    assert!(
        grown < 8 << 20,
        "the driver grew by {grown} bytes over 10,000 cycles"
    );
    let baseline = (before.objects.len(), before.used);
    wait_until(
        "the head's store is back to its baseline",
        SETTLE,
        || async {
            let now = listing(&client, "head").await;
            ((now.objects.len(), now.used) == baseline).then_some(())
        },
    )
    .await
    .unwrap();
}

async fn a_reference_in_a_message_keeps_the_object_alive(driver: &mut Driver) {
    let client = client(driver).await;
    let numbers: Vec<u64> = (1..=1000).collect();
    let object = object_store::put(&numbers).await.unwrap();
    let id = object.id();
    let keeper = actor::spawn::<Keeper>((), on("node-1")).await.unwrap();
    keeper.send(Keep(object)).await.unwrap();
    // The driver's reference is gone (moved into the message and dropped
    // after sending); the keeper's keeps the object.
    wait_until("only the worker holds the object", SETTLE, || async {
        let now = listing(&client, "head").await;
        let summary = now.objects.iter().find(|o| o.id == id)?;
        (summary.holders.len() == 1
            && summary.holders[0].starts_with("worker pid")
            && summary.in_transit == 0)
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(keeper.send(SumKept).await.unwrap(), Ok(500_500));
    keeper.send(Forget).await.unwrap();
    wait_freed(&client, "head", id).await;
    keeper.kill().await.unwrap();
}

async fn a_killed_workers_references_are_released(driver: &mut Driver) {
    let client = client(driver).await;
    let object = object_store::put(&vec![9u64; 100]).await.unwrap();
    let id = object.id();
    let keeper = actor::spawn::<Keeper>((), on("node-2")).await.unwrap();
    keeper.send(Keep(object)).await.unwrap();
    assert_eq!(keeper.send(SumKept).await.unwrap(), Ok(900));
    // SIGKILL: the worker never releases; its death does.
    keeper.kill().await.unwrap();
    wait_freed(&client, "head", id).await;
}

async fn references_inside_objects_live_as_long_as_the_object(driver: &mut Driver) {
    let client = client(driver).await;
    let inner = object_store::put(&vec![5u64; 10]).await.unwrap();
    let inner_id = inner.id();
    let outer = object_store::put(&vec![inner]).await.unwrap();
    let outer_id = outer.id();
    let found = listing(&client, "head").await;
    let summary = found.objects.iter().find(|o| o.id == inner_id).unwrap();
    assert!(
        summary.holders.contains(&format!("object {outer_id}")),
        "{summary:?}"
    );
    // Only the outer object holds the inner one now.
    let back = object_store::get(&outer).await.unwrap();
    assert_eq!(object_store::get(&back[0]).await.unwrap(), vec![5; 10]);
    drop(back);
    drop(outer);
    wait_freed(&client, "head", outer_id).await;
    wait_freed(&client, "head", inner_id).await;
}

async fn a_256_mib_object_crosses_nodes_byte_exact() {
    // Made off the driver's thread: blocking it for seconds would let its
    // connections idle out.
    let (bytes, expected) = tokio::task::spawn_blocking(|| {
        let bytes = pattern(256, 256 << 20);
        let expected = digest(&bytes);
        (bytes, expected)
    })
    .await
    .unwrap();
    let object = object_store::put_bytes(&bytes).await.unwrap();
    drop(bytes);
    for node in ["node-1", "node-2"] {
        let keeper = actor::spawn::<Keeper>((), on(node)).await.unwrap();
        let digests = keeper.send(Digests(vec![object.clone()])).await.unwrap();
        assert_eq!(digests, Ok(vec![expected]), "read on {node}");
        keeper.kill().await.unwrap();
    }
}

async fn objects_spill_to_disk_and_come_back(driver: &mut Driver) {
    let client = client(driver).await;
    let cluster = driver.local_cluster().expect("a local cluster");
    // Spilling into a directory of the user's: the node keeps to a
    // directory of its own inside it.
    let user = tempfile::TempDir::new().unwrap();
    std::fs::write(user.path().join("notes.txt"), b"mine").unwrap();
    let spill_dir = user.path().to_str().unwrap();
    let small = cluster
        .add_node(&[
            "--object-store-memory",
            "3000000",
            "--object-spill-dir",
            spill_dir,
        ])
        .unwrap();
    let node = cluster.node(small).unwrap().name().to_string();
    let own = user.path().join(format!(
        "nimbus-{node}-{}",
        cluster.node(small).unwrap().pid()
    ));
    let keeper = actor::spawn::<Keeper>((), on(&node)).await.unwrap();
    let size = 1 << 20;
    let refs = keeper
        .send(PutMany { count: 6, size })
        .await
        .unwrap()
        .unwrap();
    let found = listing(&client, &node).await;
    let spilled = found
        .objects
        .iter()
        .filter(|o| o.state == ObjectState::Spilled)
        .count();
    assert!(spilled >= 3, "6 MiB in a 3 MB store: {found:?}");
    assert!(found.used <= found.capacity, "{found:?}");
    assert_eq!(found.spilled, (spilled * size) as u64, "{found:?}");
    let spill_files = std::fs::read_dir(&own).map_or(0, |files| {
        files
            .flatten()
            .filter(|file| file.file_name() != nimbus::host::ownership::OWNER_FILE)
            .count()
    });
    assert_eq!(spill_files, spilled, "files in {}", own.display());
    // Spilled objects, worker logs and shipped programs: the user's only.
    assert_private(&own);
    let home = driver.local_cluster().unwrap().home().to_path_buf();
    assert_private(&home.join("logs"));
    assert_private(&home.join("binaries"));
    let expected: Vec<u64> = (0..6).map(|seed| digest(&pattern(seed, size))).collect();
    // Read back on their node (restored from disk) and pulled to the head.
    assert_eq!(
        keeper.send(Digests(refs.clone())).await.unwrap(),
        Ok(expected.clone())
    );
    for (object, digest_expected) in refs.iter().zip(&expected) {
        let bytes = object_store::get_bytes(object).await.unwrap();
        assert_eq!(digest(&bytes), *digest_expected);
    }
    // Larger than the whole store: refused, with the numbers.
    let refused = keeper
        .send(PutMany {
            count: 1,
            size: 4_000_000,
        })
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.contains("object store is full"), "{refused}");
    assert!(refused.contains("--object-store-memory"), "{refused}");
    // Freed objects leave the disk too.
    drop(refs);
    wait_until("the small node's store is empty", SETTLE, || async {
        let now = listing(&client, &node).await;
        (now.objects.is_empty() && now.spilled == 0 && now.used == 0).then_some(())
    })
    .await
    .unwrap();
    keeper.kill().await.unwrap();
    assert_eq!(
        std::fs::read(user.path().join("notes.txt")).unwrap(),
        b"mine"
    );
}

async fn task_chains_and_map_reduce_pass_references() {
    let options = TaskOptions::default;
    let nine = task::submit(SQUARE, Input::value(&3).unwrap(), options())
        .await
        .unwrap();
    let eighty_one = task::submit(SQUARE, Input::object(&nine), options())
        .await
        .unwrap();
    assert_eq!(object_store::get(&eighty_one).await.unwrap(), 81);
    let mut squares = Vec::new();
    for i in 0..100u64 {
        squares.push(
            task::submit(SQUARE, Input::value(&i).unwrap(), options())
                .await
                .unwrap(),
        );
    }
    let total = task::submit(SUM, Input::gather(&squares), options())
        .await
        .unwrap();
    assert_eq!(
        object_store::get(&total).await.unwrap(),
        (0..100u64).map(|i| i * i).sum::<u64>()
    );
}

async fn a_thousand_tasks_and_spilling_to_other_nodes(driver: &mut Driver) {
    let options = || TaskOptions::default().num_cpus(0.5);
    let mut results = Vec::new();
    for i in 0..1000u64 {
        results.push(
            task::submit(SQUARE, Input::value(&i).unwrap(), options())
                .await
                .unwrap(),
        );
    }
    for (i, result) in results.iter().enumerate() {
        assert_eq!(object_store::get(result).await.unwrap(), (i * i) as u64);
    }
    // The small tasks' idle leases hold CPUs until they are returned
    // (`IDLE_LEASE`); "local first" is about a node with room.
    let client = client(driver).await;
    wait_until("the head's CPUs are free again", SETTLE, || async {
        let status = client.status().await.unwrap();
        let head = status.nodes.iter().find(|n| n.head).expect("a head");
        (head.resources.used.amount("CPU") == 0.0).then_some(())
    })
    .await
    .unwrap();
    // Tasks of 1 CPU for a second each, more than the head has CPUs: the
    // first go to this process's node, the rest spill to others.
    let mut wheres = Vec::new();
    for _ in 0..8 {
        let run = TaskOptions::default().num_cpus(1.0);
        wheres.push(
            task::submit(WHERE, Input::value(&1000).unwrap(), run)
                .await
                .unwrap(),
        );
    }
    let mut nodes = Vec::new();
    for result in &wheres {
        nodes.push(object_store::get(result).await.unwrap());
    }
    let cluster = driver.local_cluster().unwrap();
    let head = cluster.node(0).unwrap().address().to_string();
    assert!(nodes.contains(&head), "local first: {nodes:?}");
    nodes.sort();
    nodes.dedup();
    assert!(nodes.len() >= 2, "spilled to other nodes: {nodes:?}");
}

async fn task_errors_and_panics_name_the_task() {
    // Each task counts its runs in a file: an error or a panic is the
    // task's failure, never retried (a lost worker would be).
    let dir = tempfile::TempDir::new().unwrap();
    let attempts = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let runs = |name: &str| {
        std::fs::read_to_string(dir.path().join(name))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let failed = task::submit(
        FAIL,
        Input::value(&("no luck".to_string(), attempts("fail"))).unwrap(),
        TaskOptions::default(),
    )
    .await
    .unwrap();
    match object_store::get(&failed).await {
        Err(ObjectStoreError::Unavailable { reason, .. }) => {
            assert!(reason.contains("task tests.fail failed"), "{reason}");
            assert!(reason.contains("no luck"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs("fail"), 1, "an Err is not retried");
    let panicked = task::submit(
        PANIC,
        Input::value(&("oh no".to_string(), attempts("panic"))).unwrap(),
        TaskOptions::default(),
    )
    .await
    .unwrap();
    match object_store::get(&panicked).await {
        Err(ObjectStoreError::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("task tests.panic failed: it panicked"),
                "{reason}"
            );
            assert!(reason.contains("oh no"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs("panic"), 1, "a panic is not retried");
}

async fn an_impossible_task_fails_fast() {
    let started = Instant::now();
    let too_big = TaskOptions::default().num_cpus(1000.0);
    match task::submit(SQUARE, Input::value(&1).unwrap(), too_big).await {
        Err(TaskError::Placement(e)) => {
            let text = e.to_string();
            assert!(text.contains("1000"), "{text}");
            assert!(text.contains("offers"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let unknown = TaskOptions::default().resource("accelerator_type:TPU", 1.0);
    match task::submit(SQUARE, Input::value(&1).unwrap(), unknown).await {
        Err(TaskError::Placement(e)) => {
            let text = e.to_string();
            assert!(text.contains("accelerator_type:TPU"), "{text}");
            assert!(text.contains("offers"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let nan = TaskOptions::default().num_cpus(f64::NAN);
    match task::submit(SQUARE, Input::value(&1).unwrap(), nan).await {
        Err(TaskError::Placement(actor::SpawnError::BadResources(e))) => {
            assert!(e.to_string().contains("\"CPU\""), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

async fn wait_then_a_task_retried_after_sigkill() {
    let marker = std::env::temp_dir().join(format!("nimbus-task-pid-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let path = marker.to_string_lossy().to_string();
    let small = || TaskOptions::default().num_cpus(0.1);
    let hanging = task::submit(PID_THEN_HANG, Input::value(&path).unwrap(), small())
        .await
        .unwrap();
    let mut quick = Vec::new();
    for i in 0..3u64 {
        quick.push(
            task::submit(SQUARE, Input::value(&i).unwrap(), small())
                .await
                .unwrap()
                .erase(),
        );
    }
    let all: Vec<_> = std::iter::once(hanging.erase()).chain(quick).collect();
    let (ready, pending) = object_store::wait(&all, 4, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(ready.len(), 3);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id(), hanging.id());
    // SIGKILL the worker process running the hanging task: the task is
    // retried on a new worker, which finds the marker and returns.
    let killed: u32 = wait_until("the task wrote its pid", SETTLE, || async {
        std::fs::read_to_string(&marker).ok()?.parse().ok()
    })
    .await
    .unwrap();
    // SAFETY: kill(2) on a pid we read from our own task's marker file.
    assert_eq!(unsafe { libc::kill(killed as i32, libc::SIGKILL) }, 0);
    let retried = object_store::get(&hanging).await.unwrap();
    assert_ne!(retried, killed);
    let _ = std::fs::remove_file(&marker);
}

async fn references_inside_task_results(driver: &mut Driver) {
    let client = client(driver).await;
    let inner = object_store::put(&42u64).await.unwrap();
    let inner_id = inner.id();
    let result = task::submit(
        PASS_ON,
        Input::value(&vec![inner]).unwrap(),
        TaskOptions::default(),
    )
    .await
    .unwrap();
    let refs = object_store::get(&result).await.unwrap();
    assert_eq!(object_store::get(&refs[0]).await.unwrap(), 42);
    drop(refs);
    let result_id = result.id();
    drop(result);
    wait_freed(&client, "head", result_id).await;
    wait_freed(&client, "head", inner_id).await;
}

async fn tasks_run_in_placement_group_bundles() {
    let group = PlacementGroup::create(
        vec![ResourceSet::of("CPU", 0.5); 3],
        PlacementStrategy::StrictSpread,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    for index in 0..3 {
        let options = TaskOptions::default()
            .num_cpus(0.5)
            .in_bundle(&group, index)
            .unwrap();
        let result = task::submit(WHERE, Input::value(&0).unwrap(), options)
            .await
            .unwrap();
        assert_eq!(
            object_store::get(&result).await.unwrap(),
            group.address(index).unwrap().to_string()
        );
    }
    group.remove().await.unwrap();
}

/// Submits a RECORD task of 50 ms logging to `path` for each of `indexes`.
async fn record_tasks(
    path: &str,
    indexes: std::ops::Range<u64>,
    options: impl Fn() -> TaskOptions,
) -> Vec<object_store::ObjectRef<u32>> {
    let mut results = Vec::new();
    for index in indexes {
        let input = Input::value(&(path.to_string(), index, 50)).unwrap();
        results.push(task::submit(RECORD, input, options()).await.unwrap());
    }
    results
}

/// The lines of the RECORD log at `path`.
fn record_log(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

async fn tasks_in_flight_on_one_worker() {
    // A bundle of 1 CPU holds one task worker of 1 CPU: the tasks beyond
    // the first go to it while it is busy (no node has room for another),
    // up to 4 in flight, and the rest queue.
    let group = PlacementGroup::create(
        vec![ResourceSet::of("CPU", 1.0)],
        PlacementStrategy::Pack,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let options = || {
        TaskOptions::default()
            .num_cpus(1.0)
            .in_bundle(&group, 0)
            .unwrap()
            .max_tasks_in_flight_per_worker(4)
    };
    let dir = tempfile::TempDir::new().unwrap();
    let log = dir.path().join("record");
    let path = log.to_string_lossy().into_owned();

    // One at a time, and a panic fails its own task only: the worker (one
    // pid throughout) runs the others before and after it.
    let mut recorded = record_tasks(&path, 0..6, options).await;
    let attempts = dir.path().join("panic").to_string_lossy().into_owned();
    let why = Input::value(&("in flight".to_string(), attempts)).unwrap();
    let panicked = task::submit(PANIC, why, options()).await.unwrap();
    recorded.extend(record_tasks(&path, 6..9, options).await);
    let mut pids = Vec::new();
    for result in &recorded {
        pids.push(object_store::get(result).await.unwrap());
    }
    match object_store::get(&panicked).await {
        Err(ObjectStoreError::Unavailable { reason, .. }) => {
            assert!(reason.contains("it panicked: in flight"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    pids.dedup();
    assert_eq!(pids.len(), 1, "one worker, alive past the panic: {pids:?}");
    let lines = record_log(&log);
    assert_eq!(lines.len(), 18, "{lines:?}");
    for pair in lines.chunks(2) {
        let index = pair[0].strip_prefix("start ").expect("a start");
        assert_eq!(pair[1], format!("end {index}"), "overlapping: {lines:?}");
    }

    // SIGKILL the worker with tasks in flight behind a hanging one: each
    // is retried once, on a new worker, and runs once.
    std::fs::remove_file(&log).unwrap();
    let marker = dir.path().join("pid");
    let hang = Input::value(&marker.to_string_lossy().into_owned()).unwrap();
    let hanging = task::submit(PID_THEN_HANG, hang, options()).await.unwrap();
    let behind = record_tasks(&path, 0..5, options).await;
    let killed: u32 = wait_until("the task wrote its pid", SETTLE, || async {
        std::fs::read_to_string(&marker).ok()?.parse().ok()
    })
    .await
    .unwrap();
    assert!(record_log(&log).is_empty(), "ran beside the hanging task");
    // SAFETY: kill(2) on a pid our own task wrote.
    assert_eq!(unsafe { libc::kill(killed as i32, libc::SIGKILL) }, 0);
    let retried = object_store::get(&hanging).await.unwrap();
    assert_ne!(retried, killed);
    for result in &behind {
        assert_ne!(object_store::get(result).await.unwrap(), killed);
    }
    let mut lines = record_log(&log);
    lines.sort();
    let mut expected: Vec<String> = (0..5)
        .flat_map(|i| [format!("end {i}"), format!("start {i}")])
        .collect();
    expected.sort();
    assert_eq!(lines, expected, "each ran exactly once");
    group.remove().await.unwrap();
}

async fn an_object_lost_with_its_owner_node_fails_clearly(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let doomed = cluster.add_node(&[]).unwrap();
    let node = cluster.node(doomed).unwrap().name().to_string();
    let keeper = actor::spawn::<Keeper>((), on(&node)).await.unwrap();
    let refs = keeper
        .send(PutMany {
            count: 1,
            size: 1000,
        })
        .await
        .unwrap()
        .unwrap();
    driver.local_cluster().unwrap().kill(doomed).unwrap();
    let started = Instant::now();
    match object_store::get_bytes(&refs[0]).await {
        Err(ObjectStoreError::Unavailable { reason, .. }) => {
            assert!(reason.contains("is lost"), "{reason}");
            assert!(reason.contains(&node), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < SETTLE);
}

/// This process's resident memory.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Asserts that nobody but its owner can read, write or enter `path`, nor
/// anything inside it.
fn assert_private(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o077,
        0,
        "{} is open to others: {:o}",
        path.display(),
        mode & 0o777
    );
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            assert_private(&entry.unwrap().path());
        }
    }
}

/// A put that stops half-way (its putter stalled or vanished) is abandoned
/// once the node's arrival timeout passes without bytes: the object fails
/// for its readers with the reason, its memory is given back, and a put
/// from offset 0 starts it over. Before, it stayed arriving for good,
/// holding its memory, and a reader waited out its own timeout.
async fn a_put_that_stops_half_way_is_abandoned(driver: &mut Driver) {
    let client = client(driver).await;
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster
        .add_node(&["--object-arrival-timeout-s", "1"])
        .unwrap();
    let name = cluster.node(index).unwrap().name().to_string();
    let status = client.status().await.unwrap();
    let node = client
        .connect_node(status.node(&name).expect("the node is known"))
        .await
        .unwrap();
    let id = ObjectId::random();
    let holder = RefHolder::Process {
        id: 7,
        label: "a putter that stalls".into(),
        worker: None,
        job: None,
    };
    let half = 1 << 20;
    let put = |offset: u64| ObjectRequest::PutObjectChunk {
        id,
        offset,
        total: 2 * half as u64,
        holder: holder.clone(),
        contains: Vec::new(),
        chunk: vec![9; half],
    };
    nimbus::client::call(&node, put(0), RequestOptions::bulk())
        .await
        .unwrap();
    let state =
        |listing: &ObjectListing| listing.objects.iter().find(|o| o.id == id).map(|o| o.state);
    assert_eq!(
        state(&listing(&client, &name).await),
        Some(ObjectState::Arriving)
    );
    wait_until("the stalled put is abandoned", SETTLE, || async {
        let now = listing(&client, &name).await;
        (state(&now) == Some(ObjectState::Failed) && now.used == 0).then_some(())
    })
    .await
    .unwrap();
    let awaited = ObjectRequest::AwaitObject { id, wait_ms: 1000 };
    match nimbus::client::call(&node, awaited, RequestOptions::control()).await {
        Ok(ObjectReply::Failed { reason, .. }) => {
            assert!(reason.contains("its upload stopped"), "{reason}");
            assert!(reason.contains("--object-arrival-timeout-s"), "{reason}");
        }
        other => panic!("expected the object failed, got {other:?}"),
    }
    // Put again, whole this time: it is complete.
    for offset in [0, half as u64] {
        nimbus::client::call(&node, put(offset), RequestOptions::bulk())
            .await
            .unwrap();
    }
    let complete = state(&listing(&client, &name).await);
    assert!(
        matches!(
            complete,
            Some(ObjectState::InMemory | ObjectState::SharedMemory)
        ),
        "{complete:?}"
    );
    cluster.kill(index).unwrap();
}

/// A node whose `/dev/shm` is small (8 MiB here; 64 MiB is a container's
/// default) says so at start, and large objects that do not fit there are
/// kept in its memory instead of failing. Before, a put past the tmpfs's
/// size failed (or killed the process writing it in place, by SIGBUS).
async fn a_small_dev_shm_keeps_large_objects_in_memory(driver: &mut Driver) {
    // SAFETY: a plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        println!("  SKIPPED: a node with a /dev/shm of its own needs root");
        return;
    }
    let client = client(driver).await;
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster
        .add_node_with_private_dirs(
            &["--object-store-memory", "67108864"],
            &[(std::path::Path::new("/dev/shm"), 8 << 20)],
        )
        .unwrap();
    let node = cluster.node(index).unwrap();
    let (name, log) = (node.name().to_string(), node.log_path().to_path_buf());
    let warned = std::fs::read_to_string(&log).unwrap();
    assert!(
        warned.contains("MiB free, less than this node's object store (64 MiB)")
            && warned.contains("--shm-size"),
        "the node names the sizes and the fix at start: {warned}"
    );
    let keeper = actor::spawn::<Keeper>((), on(&name)).await.unwrap();
    let size = 3 << 20;
    let refs = keeper
        .send(PutMany { count: 4, size })
        .await
        .unwrap()
        .expect("12 MiB of objects on a node with 8 MiB of /dev/shm");
    let digests = keeper.send(Digests(refs.clone())).await.unwrap().unwrap();
    let expected: Vec<u64> = (0..4).map(|seed| digest(&pattern(seed, size))).collect();
    assert_eq!(digests, expected, "every object reads back whole");
    let ids: Vec<ObjectId> = refs.iter().map(|r| r.id()).collect();
    drop(refs);
    for id in ids {
        wait_freed(&client, &name, id).await;
    }
    // Copies of another node's objects, pulled side by side (this node's
    // /dev/shm is a host of its own): a copy's file is not allocated up
    // front, so the node claims room on the tmpfs for each copy under way;
    // those past it are kept in memory, not failed half-way by a full
    // tmpfs.
    let elsewhere = pulled_digests(&keeper, 4..8, size).await;
    assert_eq!(
        elsewhere.0, elsewhere.1,
        "12 MiB of copies pulled onto a node with 8 MiB of /dev/shm read back whole"
    );
    // The copies are freed once the driver's references are gone, not
    // before: until then their files fill /dev/shm and the next puts
    // would be kept in memory.
    let emptied = wait_until("the pulled copies are freed", SETTLE, || async {
        listing(&client, &name)
            .await
            .objects
            .is_empty()
            .then_some(())
    })
    .await;
    if let Err(e) = emptied {
        panic!("{e}: {:?}", listing(&client, &name).await);
    }
    // Two objects no process mapped: freed, their files stay in /dev/shm
    // as spares (6 of its 8 MiB). A 5 MiB object fits none of them and
    // not beside them: the spares make way, and it lives in /dev/shm.
    let unread = keeper.send(PutMany { count: 2, size }).await.unwrap();
    let ids: Vec<ObjectId> = unread.unwrap().iter().map(|r| r.id()).collect();
    for id in ids {
        wait_freed(&client, &name, id).await;
    }
    let spares = wait_until("the freed files are spares", SETTLE, || async {
        (listing(&client, &name).await.spare == 2 * size as u64).then_some(())
    })
    .await;
    if let Err(e) = spares {
        panic!("{e}: {:?}", listing(&client, &name).await);
    }
    let larger = keeper
        .send(PutMany {
            count: 1,
            size: 5 << 20,
        })
        .await
        .unwrap()
        .unwrap();
    let now = listing(&client, &name).await;
    let state = now.objects.iter().find(|o| o.id == larger[0].id());
    assert_eq!(
        state.map(|o| o.state),
        Some(ObjectState::SharedMemory),
        "{now:?}"
    );
    assert_eq!(now.spare, 0, "{now:?}");
    drop(larger);
    keeper.kill().await.unwrap();
    cluster.kill(index).unwrap();
}

/// The digests `keeper` reads of objects of `size` bytes from `seeds`, put
/// by the driver (on its own node), and the digests expected. The objects
/// are dropped before this returns.
async fn pulled_digests(
    keeper: &actor::ActorHandle<Keeper>,
    seeds: std::ops::Range<u64>,
    size: usize,
) -> (Vec<u64>, Vec<u64>) {
    let mut refs = Vec::new();
    let mut expected = Vec::new();
    for seed in seeds {
        let bytes = pattern(seed, size);
        expected.push(digest(&bytes));
        refs.push(object_store::put_bytes(&bytes).await.unwrap());
    }
    let read = keeper.send(Digests(refs)).await.unwrap();
    (read.expect("the copies read back"), expected)
}

/// A put of an object its node freed already (a batch sent again, a put
/// that comes late) is refused: stored again, it would be held by no one
/// and never freed.
async fn a_late_put_of_a_freed_object_is_refused(driver: &mut Driver) {
    let client = client(driver).await;
    let node = store_of(&client, "head").await;
    let id = ObjectId::random();
    let holder = test_holder(7, "a putter that repeats itself");
    let bytes = vec![5u8; 1024];
    let call = |request| ask(&node, request);
    let put = || put_whole(id, &holder, bytes.clone());
    call(put()).await.unwrap();
    release_at(&node, &holder, &[id]).await;
    wait_freed(&client, "head", id).await;
    let again = call(put()).await;
    let refused = format!("{again:?}");
    assert!(refused.contains("freed"), "{refused}");
    call(ObjectRequest::PutObjects {
        holder: holder.clone(),
        objects: vec![SmallObject {
            id,
            bytes: bytes.clone(),
        }],
    })
    .await
    .unwrap();
    let now = listing(&client, "head").await;
    assert!(now.objects.iter().all(|o| o.id != id), "{now:?}");
    let awaited = call(ObjectRequest::AwaitObject { id, wait_ms: 0 }).await;
    match awaited {
        Ok(ObjectReply::Failed { reason, .. }) => {
            assert!(reason.contains("freed"), "{reason}")
        }
        other => panic!("expected the object freed, got {other:?}"),
    }
}

/// A small object in a node's memory is read whole or in part (answered
/// without its shard, `small_reads.rs`) until it is freed; then the read
/// says it was freed instead of answering its old bytes.
async fn a_small_object_is_read_until_it_is_freed(driver: &mut Driver) {
    let client = client(driver).await;
    let node = store_of(&client, "head").await;
    let id = ObjectId::random();
    let holder = test_holder(8, "a putter that lets go");
    let bytes = pattern(3, 1000);
    let call = |request| ask(&node, request);
    let read = |offset, len| ObjectRequest::ReadObject {
        id,
        offset,
        len,
        copy_at: None,
    };
    call(put_whole(id, &holder, bytes.clone())).await.unwrap();
    match call(read(0, 1 << 20)).await {
        Ok(ObjectReply::Bytes(got)) => assert_eq!(got, bytes),
        other => panic!("expected its bytes, got {other:?}"),
    }
    match call(read(10, 5)).await {
        Ok(ObjectReply::Bytes(got)) => assert_eq!(got, bytes[10..15]),
        other => panic!("expected 5 of its bytes, got {other:?}"),
    }
    release_at(&node, &holder, &[id]).await;
    wait_freed(&client, "head", id).await;
    match call(read(0, 1 << 20)).await {
        Ok(ObjectReply::Bytes(got)) => panic!("{} bytes read after the free", got.len()),
        other => assert!(format!("{other:?}").contains("freed"), "{other:?}"),
    }
}

/// Reads answered without the object's shard (`small_reads.rs`) count as
/// uses: under memory pressure the least recently used object is spilled,
/// not the one put first and read since.
async fn a_small_object_read_last_is_not_spilled_first(driver: &mut Driver) {
    let client = client(driver).await;
    let name = add_node(driver, &["--object-store-memory", "200000"]);
    let node = store_of(&client, &name).await;
    let call = |request| ask(&node, request);
    let holder = test_holder(9, "a putter that reads its first object");
    // One shard holds them all (ids divisible by every shard count the
    // node may run, 1 to 4): the first it is asked to spill.
    let base = ObjectId::random().0 / 24 * 12;
    let ids: Vec<ObjectId> = (0..4).map(|i| ObjectId(base + 12 * i)).collect();
    let size = 60_000;
    let put = |id, seed| put_whole(id, &holder, pattern(seed, size));
    for (seed, id) in ids[..3].iter().enumerate() {
        call(put(*id, seed as u64)).await.unwrap();
    }
    let read = ObjectRequest::ReadObject {
        id: ids[0],
        offset: 0,
        len: size as u64,
        copy_at: None,
    };
    match call(read).await {
        Ok(ObjectReply::Bytes(got)) => assert_eq!(got, pattern(0, size)),
        other => panic!("expected the first object's bytes, got {other:?}"),
    }
    // 180 kB held of 200 kB: the fourth makes the shard spill one.
    call(put(ids[3], 3)).await.unwrap();
    let found = listing(&client, &name).await;
    let states: Vec<ObjectState> = ids
        .iter()
        .map(|id| {
            let object = found.objects.iter().find(|o| o.id == *id);
            object
                .unwrap_or_else(|| panic!("{id} is listed: {found:?}"))
                .state
        })
        .collect();
    assert_eq!(
        states,
        [
            ObjectState::InMemory,
            ObjectState::Spilled,
            ObjectState::InMemory,
            ObjectState::InMemory
        ],
        "the second, unread, is the least recently used"
    );
    release_at(&node, &holder, &ids).await;
    for id in ids {
        wait_freed(&client, &name, id).await;
    }
}
