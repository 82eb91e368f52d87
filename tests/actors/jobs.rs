//! Jobs from the command line, as an operator runs them against the test
//! cluster: `nimbus job submit` runs this binary as a detached driver on
//! the head (its mode chosen with `--env`), streams its output and exits
//! with its outcome; `job stop`, `job list`, `job status`, `job logs`; a
//! job's actors end with its driver.

use std::process::Stdio;
use std::time::Duration;

use nimbus::actor::{self, SpawnOptions};
use nimbus::testing::check::wait_until;
use nimbus::Driver;

use crate::fixtures::{registry, Add, Counter};

/// Selects what this binary does as a submitted job's driver: `ok`
/// (spawn an actor, print, exit 0), `fail` (exit 3), `wait` (spawn an
/// actor, print, wait to be stopped).
pub const JOB_DRIVER: &str = "NIMBUS_TEST_JOB_DRIVER";

/// Selects what this binary does as a program with a private local cluster
/// of its own: `ok` or `fail` (its work returns an error).
pub const PROGRAM_WITH_ITS_OWN_CLUSTER: &str = "NIMBUS_TEST_OWN_CLUSTER";

/// The CLI of the test cluster, authenticated with a private token file.
pub struct Operator {
    program: std::path::PathBuf,
    program_args: Vec<String>,
    address: String,
    token_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Operator {
    /// An operator of `cluster`.
    pub fn of(cluster: &nimbus::local::LocalCluster) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, cluster.token().to_string()).unwrap();
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        Operator {
            program: cluster.program().to_path_buf(),
            program_args: cluster.program_args().to_vec(),
            address: cluster.address().to_string(),
            token_file,
            _dir: dir,
        }
    }

    /// `nimbus ARGS --address ... --token-file ...`, not yet started.
    /// Arguments after a `--` stay after it.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(&self.program_args)
            .args(&args[..split])
            .args(["--address", &self.address, "--token-file"])
            .arg(&self.token_file)
            .args(&args[split..])
            .kill_on_drop(true);
        command
    }

    /// Runs `nimbus ARGS`: its exit code, stdout and stderr.
    pub async fn run(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("nimbus {args:?} ended within 60 s"))
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Whether `nimbus list actors` shows no actor of `job`.
    async fn no_actor_of(&self, job: &str) -> bool {
        self.actors_of(job)
            .await
            .iter()
            .all(|actor| actor["state"] == "DEAD")
    }

    /// `nimbus list actors --json --filter job=JOB`: its live actors, then
    /// the dead ones the head keeps.
    async fn actors_of(&self, job: &str) -> Vec<serde_json::Value> {
        let filter = format!("job={job}");
        let (code, listed, err) = self
            .run(&["list", "actors", "--json", "--filter", &filter])
            .await;
        assert_eq!(code, Some(0), "{err}");
        serde_json::from_str(&listed).unwrap()
    }

    /// `nimbus job status JOB --json`.
    async fn status(&self, job: &str) -> serde_json::Value {
        let (code, out, err) = self.run(&["job", "status", job, "--json"]).await;
        assert_eq!(code, Some(0), "{err}");
        serde_json::from_str(&out).unwrap()
    }
}

/// The job id a `nimbus job submit` printed first.
fn job_id(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("job: "))
        .unwrap_or_else(|| panic!("no `job: ID` line in {stdout:?}"))
        .to_string()
}

/// Ray's `ray job submit`: a driver run on the head, detached from the
/// submitter, its output streamed, the submitter exiting with its outcome;
/// the job's actors end with its driver (submitted jobs are not kept alive
/// by beats: only the driver's exit ends them, so the actors are gone
/// because it ended); a failed and a stopped job keep their records.
pub async fn a_submitted_job_runs_streams_and_ends_with_its_actors(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let operator = Operator::of(cluster);
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    let mode = |m: &str| format!("{JOB_DRIVER}={m}");

    let ok = mode("ok");
    let (code, out, err) = operator
        .run(&["job", "submit", "--name", "e2e", "--env", &ok, "--", me])
        .await;
    assert_eq!(code, Some(0), "{out}{err}");
    let job = job_id(&out);
    assert!(
        out.contains("job driver: counter=42"),
        "the driver's output is streamed: {out}"
    );
    assert!(err.contains(&format!("job {job} SUCCEEDED")), "{err}");
    let gone = wait_until(
        "the job's actor is killed",
        Duration::from_secs(20),
        || async { operator.no_actor_of(&job).await.then_some(()) },
    )
    .await;
    assert!(gone.is_ok(), "{gone:?}");
    let status = operator.status(&job).await;
    assert_eq!(status["state"], "SUCCEEDED", "{status}");
    assert_eq!(status["name"], "e2e");
    assert_eq!(status["submitted"], true);

    let fail = mode("fail");
    let (code, _, err) = operator
        .run(&["job", "submit", "--env", &fail, "--", me])
        .await;
    assert_eq!(
        code,
        Some(3),
        "the submitter exits with the driver's code: {err}"
    );

    let wait = mode("wait");
    let (code, out, err) = operator
        .run(&["job", "submit", "--no-wait", "--env", &wait, "--", me])
        .await;
    assert_eq!(code, Some(0), "{err}");
    let waiting = job_id(&out);
    let spawned = wait_until(
        "the waiting job's actor runs",
        Duration::from_secs(30),
        || async {
            let found = actor::get_actor::<Counter>("job-waiter")
                .await
                .ok()
                .flatten();
            found.map(|_| ())
        },
    )
    .await;
    assert!(spawned.is_ok(), "{spawned:?}");
    for logs_of in [&["job", "logs", &waiting][..], &["logs", "--job", &waiting]] {
        let (code, logs, err) = operator.run(logs_of).await;
        assert_eq!(code, Some(0), "{err}");
        assert!(logs.contains("job driver: waiting"), "{logs_of:?}: {logs}");
    }
    let (code, stopped, err) = operator.run(&["job", "stop", &waiting]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(stopped.contains("STOPPED"), "{stopped}");
    let gone = wait_until(
        "the stopped job's actor is killed",
        Duration::from_secs(20),
        || async { operator.no_actor_of(&waiting).await.then_some(()) },
    )
    .await;
    assert!(gone.is_ok(), "{gone:?}");
    let (code, _, err) = operator.run(&["job", "stop", &waiting]).await;
    assert!(
        code != Some(0) && err.contains("has ended already"),
        "{err}"
    );
    // Its actor is still listed, dead, with its job and cause, and its log
    // is found by name within the job (not by name alone: only live
    // actors have names of their own).
    let dead = operator.actors_of(&waiting).await;
    let waiter = dead.iter().find(|a| a["name"] == "job-waiter");
    let waiter = waiter.unwrap_or_else(|| panic!("the stopped job's actor is listed: {dead:?}"));
    assert_eq!(waiter["state"], "DEAD", "{waiter}");
    assert_ne!(waiter["death"], "", "{waiter}");
    let filtered = operator
        .run(&[
            "list",
            "actors",
            "--json",
            "--filter",
            "state=DEAD",
            "--filter",
            "name=job-waiter",
        ])
        .await;
    assert!(filtered.1.contains(&waiting), "{filtered:?}");
    let (code, _, err) = operator
        .run(&["logs", "job-waiter", "--job", &waiting])
        .await;
    assert_eq!(
        code,
        Some(0),
        "the dead actor's log is found by name and job: {err}"
    );
    let (code, _, err) = operator.run(&["logs", "job-waiter"]).await;
    assert!(code != Some(0) && err.contains("--job"), "{err}");

    let (code, stopped_jobs, err) = operator
        .run(&["list", "jobs", "--json", "--filter", "state=STOPPED"])
        .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(stopped_jobs.contains(&waiting), "{stopped_jobs}");
    assert!(!stopped_jobs.contains(&job), "{stopped_jobs}");
    let (code, listed, err) = operator.run(&["job", "list", "--json"]).await;
    assert_eq!(code, Some(0), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let state_of = |id: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .map(|j| j["state"].as_str().unwrap().to_string())
    };
    assert_eq!(state_of(&job).as_deref(), Some("SUCCEEDED"));
    assert_eq!(state_of(&waiting).as_deref(), Some("STOPPED"));
    let failed: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["state"] == "FAILED" && j["message"].as_str().unwrap().contains("code 3"))
        .collect();
    assert_eq!(failed.len(), 1, "{listed}");
}

/// `--working-dir`: the directory is packed, shipped to the node and the
/// driver runs inside it; a program that cannot start fails the submission
/// with the node's reason and leaves no directory behind.
pub async fn a_jobs_working_directory_travels_with_it(driver: &mut Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let operator = Operator::of(cluster);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/input.txt"), "shipped with the job\n").unwrap();
    let script = dir.path().join("run.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat data/input.txt\necho \"GREETING=$GREETING\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let working_dir = dir.path().to_str().unwrap();
    let mut submit = operator.command(&[
        "job",
        "submit",
        "--working-dir",
        working_dir,
        "--env",
        "GREETING=hi",
        "--",
        "./run.sh",
    ]);
    let out = submit.stdout(Stdio::piped()).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("shipped with the job"), "{stdout}");
    assert!(stdout.contains("GREETING=hi"), "{stdout}");

    // A relative path with no working directory to be relative to: refused
    // before anything is sent, saying what to do.
    let (code, _, err) = operator
        .run(&["job", "submit", "--", "./no-such-program"])
        .await;
    assert_eq!(code, Some(1));
    assert!(
        err.contains("the program \"./no-such-program\" is a relative path, and without --working-dir the driver runs in an empty directory"),
        "{err}"
    );
    // A bare name the node's PATH does not have: the node's refusal.
    let (code, _, err) = operator
        .run(&["job", "submit", "--", "no-such-program"])
        .await;
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot start \"no-such-program\""), "{err}");
    let (code, _, err) = operator
        .run(&[
            "job",
            "submit",
            "--working-dir",
            "/no/such/dir",
            "--",
            "true",
        ])
        .await;
    assert_eq!(code, Some(1));
    assert!(err.contains("/no/such/dir: not a directory"), "{err}");
}

/// This binary as a submitted job's driver (`JOB_DRIVER` selects what it
/// does): it joins with the `NIMBUS_ADDRESS`, `NIMBUS_TOKEN` and
/// `NIMBUS_JOB_ID` its node gave it.
pub fn job_driver(mode: &str) {
    if mode == "fail" {
        println!("job driver: failing");
        std::process::exit(3);
    }
    let driver = nimbus::init(registry()).expect("joins the cluster it was submitted to");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let options = SpawnOptions::default().num_cpus(0.1);
        if mode == "wait" {
            let waiter = actor::spawn::<Counter>(0, options.clone().name("job-waiter"))
                .await
                .unwrap();
            println!("job driver: waiting");
            std::future::pending::<()>().await;
            drop(waiter);
        }
        let counter = actor::spawn::<Counter>(41, options).await.unwrap();
        let n = counter.send(Add(1)).await.unwrap();
        // Dropping the handle leaves the actor running: it lives until
        // its job ends.
        println!("job driver: counter={n}");
    });
}

/// A program's own local cluster keeps its directory (node and worker
/// logs) when the program fails, and says where; it is removed when the
/// program succeeds.
pub async fn a_failed_programs_local_cluster_keeps_its_logs(_: &mut Driver) {
    let run = |mode: &str| {
        let tmp = tempfile::tempdir().unwrap();
        let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
        command
            .env(PROGRAM_WITH_ITS_OWN_CLUSTER, mode)
            .env("TMPDIR", tmp.path())
            .env_remove("NIMBUS_ADDRESS")
            .kill_on_drop(true);
        (command, tmp)
    };
    let (mut ok, tmp) = run("ok");
    let out = tokio::time::timeout(Duration::from_secs(60), ok.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "a program that succeeded leaves nothing: {left:?}"
    );

    let (mut failing, tmp) = run("fail");
    let out = tokio::time::timeout(Duration::from_secs(60), failing.output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let kept = stderr
        .lines()
        .find_map(|line| {
            line.split_once("are kept in ")
                .map(|(_, dir)| dir.to_string())
        })
        .unwrap_or_else(|| panic!("where the files are kept: {stderr}"));
    assert!(kept.starts_with(tmp.path().to_str().unwrap()), "{kept}");
    let logs: Vec<String> = std::fs::read_dir(std::path::Path::new(&kept).join("logs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        logs.iter().any(|name| name.starts_with("worker-")),
        "its worker's log is kept: {logs:?}"
    );
}

/// This binary as a program with a local cluster of its own, whose work
/// spawns an actor, then succeeds or fails as `mode` says.
pub fn program_with_its_own_cluster(mode: &str) {
    let driver = nimbus::init_with(registry(), nimbus::InitOptions::private(1))
        .expect("a private local cluster starts");
    let done = driver.block_on(async {
        let counter = actor::spawn::<Counter>(0, SpawnOptions::default().num_cpus(0.1)).await?;
        counter.send(Add(1)).await?;
        match mode {
            "fail" => Err(anyhow::anyhow!("the program's own failure")),
            _ => Ok(()),
        }
    });
    drop(driver);
    if let Err(e) = done {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// `nimbus list tasks`: each task's latest state reaches the head within
/// about a second of changing, with its name, job, attempts and error.
pub async fn tasks_are_listed_with_their_state(driver: &mut Driver) {
    use nimbus::task::{self, Input, TaskOptions};
    let cluster = driver.local_cluster().expect("a local cluster");
    let operator = Operator::of(cluster);
    let options = || TaskOptions::default().num_cpus(0.1);
    let mut results = Vec::new();
    for n in [2u64, 4, 7] {
        results.push(
            task::submit(crate::fixtures::HALVE, Input::value(&n).unwrap(), options())
                .await
                .unwrap(),
        );
    }
    assert_eq!(nimbus::object_store::get(&results[0]).await.unwrap(), 1);
    assert!(nimbus::object_store::get(&results[2]).await.is_err());
    let job = actor::ProcessContext::current().unwrap().job.clone();
    let filter = format!("job={job}");
    let listed = wait_until(
        "the tasks' ends are listed",
        Duration::from_secs(20),
        || async {
            let (code, out, err) = operator
                .run(&[
                    "list",
                    "tasks",
                    "--json",
                    "--filter",
                    &filter,
                    "--filter",
                    "name=tests.halve",
                ])
                .await;
            assert_eq!(code, Some(0), "{err}");
            let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
            let rows = rows.as_array().unwrap().clone();
            let ended = rows
                .iter()
                .filter(|r| r["state"] == "FINISHED" || r["state"] == "FAILED")
                .count();
            (ended == 3).then_some(rows)
        },
    )
    .await
    .unwrap();
    let ids: Vec<String> = results.iter().map(|r| r.id().to_string()).collect();
    for row in &listed {
        assert!(
            ids.contains(&row["id"].as_str().unwrap().to_string()),
            "{row}"
        );
        assert_eq!(row["attempts"], 1, "{row}");
    }
    let failed: Vec<_> = listed.iter().filter(|r| r["state"] == "FAILED").collect();
    assert_eq!(failed.len(), 1, "{listed:?}");
    assert!(
        failed[0]["error"].as_str().unwrap().contains("7 is odd"),
        "{listed:?}"
    );
}
