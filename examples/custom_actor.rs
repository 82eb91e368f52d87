//! Your own actors across a cluster: a counter, and a named bank of account
//! actors that transfer money to each other by passing handles, one of them
//! killed mid-run and restarted by policy.
//!
//! ```text
//! make run EXAMPLE=custom_actor
//! ```
//!
//! With no `--address`, the program starts a 3-node local cluster of its
//! own; every actor runs in a worker process started from this very binary
//! (`pgrep -f nimbus-worker` lists them while it runs). You should see the
//! counter's replies, the accounts' placement, the transfers, the killed
//! account's death and restart, and a last `summary:` line with
//! `total_balance_ok=true`: every account's balance matches the transfers
//! the driver saw acknowledged (and any unacknowledged one the ledger
//! applied), and each acknowledged transfer was applied exactly once.
//!
//! With `--hold`, the program keeps its actors after the summary until its
//! standard input closes (Ctrl-D), to look at them with `nimbus list
//! actors` or on the dashboard of a cluster given with `--address` (its
//! own local cluster serves none). `--help` lists the options.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::time::Instant;

use actix::prelude::*;
use anyhow::{bail, Context as _, Result};
use clap::Parser;
use nimbus::actor::{self, ActorHandle, RemoteActor, RemoteMessage, SpawnOptions, Strategy};
use serde::{Deserialize, Serialize};

const ACCOUNTS: usize = 4;
const OPENING_BALANCE: i64 = 1_000;
const TRANSFERS: usize = 200;

/// Counts.
struct Counter(i64);

impl Actor for Counter {
    type Context = Context<Self>;
}

impl RemoteActor for Counter {
    const NAME: &'static str = "examples.Counter";
    type Args = i64;
    fn from_args(start: i64) -> Self {
        Counter(start)
    }
}

/// Adds to the counter; replies with the new value.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "i64")]
struct Add(i64);

impl RemoteMessage for Add {
    const NAME: &'static str = "examples.Add";
}

impl Handler<Add> for Counter {
    type Result = i64;
    fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) -> i64 {
        self.0 += n;
        self.0
    }
}

/// One bank account. Its state lives in the actor; a restarted account
/// starts again from its constructor arguments (its opening balance), so
/// the bank keeps the authoritative ledger in the `Ledger` actor.
struct Account {
    name: String,
    ledger: ActorHandle<Ledger>,
}

impl Actor for Account {
    type Context = Context<Self>;
}

impl RemoteActor for Account {
    const NAME: &'static str = "examples.Account";
    type Args = (String, ActorHandle<Ledger>);
    fn from_args((name, ledger): Self::Args) -> Self {
        // Goes to the worker's log on its node: `nimbus logs account-N`.
        if let Some(me) = actor::this_worker() {
            println!(
                "{name} started on {} (incarnation {})",
                me.node.name, me.worker.incarnation
            );
        }
        Account { name, ledger }
    }
}

/// Send `amount` to the account behind `to` (a handle, which may live on
/// another node): this account asks it to take the money.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
struct Transfer {
    id: u64,
    to: ActorHandle<Account>,
    amount: i64,
}

impl RemoteMessage for Transfer {
    const NAME: &'static str = "examples.Transfer";
}

impl Handler<Transfer> for Account {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, t: Transfer, _: &mut Context<Self>) -> Self::Result {
        let from = self.name.clone();
        Box::pin(async move {
            let credit = Credit {
                id: t.id,
                from,
                amount: t.amount,
            };
            t.to.send(credit).await.map_err(|e| e.to_string())?
        })
    }
}

/// Take `amount` from account `from`: the receiving account books it in
/// the ledger.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
struct Credit {
    id: u64,
    from: String,
    amount: i64,
}

impl RemoteMessage for Credit {
    const NAME: &'static str = "examples.Credit";
}

impl Handler<Credit> for Account {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, c: Credit, _: &mut Context<Self>) -> Self::Result {
        let (ledger, to) = (self.ledger.clone(), self.name.clone());
        Box::pin(async move {
            let moved = Move {
                id: c.id,
                from: c.from,
                to,
                amount: c.amount,
            };
            ledger.send(moved).await.map_err(|e| e.to_string())?
        })
    }
}

/// The bank's books: balances by account, and how many times each transfer
/// (by id) was applied, so the driver can check both against what it saw
/// acknowledged.
struct Ledger {
    balances: std::collections::BTreeMap<String, i64>,
    applied: std::collections::BTreeMap<u64, u32>,
}

impl Actor for Ledger {
    type Context = Context<Self>;
}

impl RemoteActor for Ledger {
    const NAME: &'static str = "examples.Ledger";
    type Args = Vec<String>;
    fn from_args(accounts: Vec<String>) -> Self {
        let balances = accounts.into_iter().map(|a| (a, OPENING_BALANCE)).collect();
        Ledger {
            balances,
            applied: Default::default(),
        }
    }
}

#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
struct Move {
    id: u64,
    from: String,
    to: String,
    amount: i64,
}

impl RemoteMessage for Move {
    const NAME: &'static str = "examples.Move";
}

impl Handler<Move> for Ledger {
    type Result = Result<(), String>;
    fn handle(&mut self, m: Move, _: &mut Context<Self>) -> Result<(), String> {
        let from = *self.balances.get(&m.from).ok_or("no such account")?;
        if from < m.amount {
            return Err(format!("{} has only {from}", m.from));
        }
        if !self.balances.contains_key(&m.to) {
            return Err(format!("no account {}", m.to));
        }
        *self.balances.get_mut(&m.from).expect("checked") -= m.amount;
        *self.balances.get_mut(&m.to).expect("checked") += m.amount;
        *self.applied.entry(m.id).or_default() += 1;
        Ok(())
    }
}

/// The books: balances, and the times each transfer id was applied.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "(Vec<(String, i64)>, Vec<(u64, u32)>)")]
struct Books;

impl RemoteMessage for Books {
    const NAME: &'static str = "examples.Books";
}

impl Handler<Books> for Ledger {
    type Result = MessageResult<Books>;
    fn handle(&mut self, _: Books, _: &mut Context<Self>) -> Self::Result {
        MessageResult((
            self.balances.clone().into_iter().collect(),
            self.applied.clone().into_iter().collect(),
        ))
    }
}

fn registry() -> actor::Registry {
    actor::Registry::new()
        .actor::<Counter>()
        .message::<Counter, Add>()
        .actor::<Ledger>()
        .message::<Ledger, Move>()
        .message::<Ledger, Books>()
        .actor::<Account>()
        .message::<Account, Transfer>()
        .message::<Account, Credit>()
}

/// Your own actors across a cluster: a counter and a bank of accounts.
#[derive(Parser)]
struct Args {
    /// Keep the actors after the summary until standard input closes
    /// (Ctrl-D), to look at them with `nimbus list actors`.
    #[arg(long)]
    hold: bool,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    let (driver, args) = nimbus::init_parsed::<Args>(registry(), |args| {
        nimbus::InitOptions::private(args.cluster.nodes.unwrap_or(3))
    })?;
    // Connects, runs, and on an error keeps the local cluster's node and
    // worker logs and says where.
    driver.block_on(run(&driver, &args))
}

async fn run(driver: &nimbus::Driver, args: &Args) -> Result<()> {
    let started = Instant::now();
    println!("cluster at {}", driver.address());

    // Pinned to a node looked up in the cluster's status (a member, or the
    // head when it is alone): names differ between clusters.
    let member = member_node().await?;
    let counter = actor::spawn::<Counter>(
        10,
        SpawnOptions::default()
            .num_cpus(0.5)
            .strategy(Strategy::Node(member.id)),
    )
    .await?;
    let record = counter.record().await?;
    println!(
        "counter on {} (worker {})",
        record.node.name, record.address
    );
    for n in 1..=3 {
        println!("counter + {n} = {}", counter.send(Add(n)).await?);
    }

    let names: Vec<String> = (0..ACCOUNTS).map(|i| format!("account-{i}")).collect();
    // The books live on the head, which fault plans never kill (a lost
    // ledger would lose the bank's state: actors restart from their
    // arguments), and alone: holding all its CPUs, they leave the accounts
    // to the other nodes, where a plan's node loss can hit them.
    let head = head_node().await?;
    let ledger = actor::spawn::<Ledger>(
        names.clone(),
        SpawnOptions::default()
            .name("bank")
            .num_cpus(head.resources.total.amount(nimbus::cluster::CPU))
            .strategy(Strategy::Node(head.id)),
    )
    .await?;
    let bank = actor::get_actor::<Ledger>("bank")
        .await?
        .context("the bank is registered by name")?;
    let mut accounts = Vec::new();
    for name in &names {
        // Named, so fault plans can target an account by a stable name.
        // Two restarts: one for this program's own kill below, one for a
        // fault plan's (a lost node's accounts restart on other nodes).
        let options = SpawnOptions::default()
            .name(name.clone())
            .num_cpus(0.25)
            .strategy(Strategy::Spread)
            .max_restarts(2);
        let account = actor::spawn::<Account>((name.clone(), bank.clone()), options).await?;
        println!("{name} on {}", account.record().await?.node.name);
        accounts.push(account);
    }

    let mut ok = 0;
    let mut failed = 0;
    // Every transfer sent (id → from, to, amount) and those acknowledged.
    let mut sent = std::collections::BTreeMap::new();
    let mut acknowledged = std::collections::BTreeSet::new();
    let mut restarts = 0;
    let victim = accounts[1].clone();
    for i in 0..TRANSFERS {
        if i == TRANSFERS / 2 {
            let record = victim.record().await?;
            let pid = nimbus::local::worker_pid(record.actor)
                .context("account-1's worker process is on this machine")?;
            // Deaths before this one (a fault plan's) are not this kill's.
            let mut after = actor::ProcessContext::current()
                .context("connected")?
                .last_event()
                .await?;
            println!("killing account-1's worker (pid {pid}) with SIGKILL");
            // SAFETY: kill() has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let death = actor::next_death(&victim, &mut after).await?;
            println!(
                "account-1 died: {} (restarting: {})",
                death.reason, death.restarting
            );
            restarts += 1;
        }
        let (from, to) = (i % ACCOUNTS, (i * 7 + 1) % ACCOUNTS);
        let (id, amount) = (i as u64, (i % 50) as i64 + 1);
        sent.insert(id, (from, to, amount));
        match accounts[from]
            .send(Transfer {
                id,
                to: accounts[to].clone(),
                amount,
            })
            .await
        {
            Ok(Ok(())) => {
                ok += 1;
                acknowledged.insert(id);
            }
            Ok(Err(refused)) => {
                failed += 1;
                println!("transfer {i} refused: {refused}");
            }
            Err(e) => {
                failed += 1;
                println!("transfer {i} failed: {e}");
            }
        }
    }
    let (balances, applied) = ledger.send(Books).await?;
    for (name, balance) in &balances {
        println!("{name}: {balance}");
    }
    let problems = check_books(&balances, &applied, &sent, &acknowledged);
    for problem in &problems {
        println!("books: {problem}");
    }
    let total_ok = problems.is_empty();
    println!(
        "{ok} transfers applied ({failed} refused or failed) in {:.1?}",
        started.elapsed()
    );
    println!(
        "summary: nodes={} actors={} transfers={ok} restarts={restarts} total_balance_ok={total_ok}",
        status().await?.alive().count(),
        2 + ACCOUNTS
    );
    if !total_ok {
        bail!("the books do not balance: {}", problems.join("; "));
    }
    if args.hold {
        println!("holding the actors until standard input closes (Ctrl-D)");
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await??;
    }
    Ok(())
}

/// What is wrong with the ledger's books, against what this driver sent and
/// saw acknowledged: every acknowledged transfer applied exactly once, no
/// other applied more than once (a failed call may or may not have been
/// applied), nothing applied that was never sent, and every account's
/// balance equal to its opening balance plus the transfers applied.
fn check_books(
    balances: &[(String, i64)],
    applied: &[(u64, u32)],
    sent: &std::collections::BTreeMap<u64, (usize, usize, i64)>,
    acknowledged: &std::collections::BTreeSet<u64>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let times: std::collections::BTreeMap<u64, u32> = applied.iter().copied().collect();
    for id in acknowledged {
        match times.get(id) {
            Some(1) => {}
            other => problems.push(format!(
                "acknowledged transfer {id} applied {} times",
                other.unwrap_or(&0)
            )),
        }
    }
    let mut expected = [OPENING_BALANCE; ACCOUNTS];
    for (id, count) in &times {
        let Some(&(from, to, amount)) = sent.get(id) else {
            problems.push(format!("transfer {id} was applied but never sent"));
            continue;
        };
        if *count > 1 {
            problems.push(format!("transfer {id} applied {count} times"));
        }
        expected[from] -= amount * i64::from(*count);
        expected[to] += amount * i64::from(*count);
    }
    for (index, want) in expected.iter().enumerate() {
        let name = format!("account-{index}");
        let have = balances.iter().find(|(n, _)| *n == name).map(|(_, b)| *b);
        if have != Some(*want) {
            problems.push(format!("{name} holds {have:?}, expected {want}"));
        }
    }
    problems
}

/// The cluster as the head sees it.
async fn status() -> Result<nimbus::cluster::ClusterStatus> {
    let context = actor::ProcessContext::current().context("connected")?;
    match context
        .call_head(nimbus::cluster::MembershipRequest::Status)
        .await?
    {
        nimbus::cluster::MembershipReply::Status(status) => Ok(status),
        other => bail!("unexpected reply to Status: {other:?}"),
    }
}

/// The head node.
/// The middle one of the alive nodes that are not the head (the shipped
/// fault plans stall the first and kill the last), else the head.
async fn member_node() -> Result<nimbus::cluster::NodeStatus> {
    let status = status().await?;
    let members: Vec<_> = status.alive().filter(|n| !n.head).collect();
    match members.get(members.len() / 2) {
        Some(member) => Ok((*member).clone()),
        None => head_node().await,
    }
}

async fn head_node() -> Result<nimbus::cluster::NodeStatus> {
    let status = status().await?;
    let head = status.nodes.into_iter().find(|n| n.head);
    head.context("the cluster has a head")
}
