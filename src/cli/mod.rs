//! The `nimbus` command line: start, inspect and stop cluster nodes.
//!
//! ```text
//! nimbus start --head [--port 6379] [--block]
//! nimbus start --address HOST:PORT --token TOKEN [--num-cpus N] [--num-gpus N] [--resources JSON]
//! nimbus status [--address HOST:PORT --token TOKEN] [--json]
//! nimbus memory [--address HOST:PORT --token TOKEN] [--json] [--limit N]
//! nimbus list actors|nodes|objects|jobs|placement-groups|tasks|runs [--filter KEY=VALUE]... [--json] [--limit N]
//! nimbus logs ACTOR [--stderr] | --job ID | --node NAME [--tail N] [--follow]
//! nimbus kill ACTOR
//! nimbus job submit [--working-dir DIR] [--env K=V]... [--name NAME] [--node NODE] [--no-wait] -- PROGRAM ARGS...
//! nimbus job list|status ID|logs ID [--follow]|stop ID
//! nimbus stop [--force]
//! nimbus chaos run PLAN.toml [--nodes 3] -- COMMAND...
//! nimbus plot RUN_DIR
//! nimbus up CLUSTER.toml | nimbus down CLUSTER.toml
//! nimbus rotate-ticket-key [--address HOST:PORT --token TOKEN]
//! ```
//!
//! It lives in the library so that every program built on nimbus carries
//! it: the `nimbus` binary is [`main`], and a user's program started with
//! [`crate::runtime::NODE_ARG`] first runs these same commands
//! ([`run_as_node`], from `nimbus::init`). That is
//! how a program's local cluster runs its node daemons from the program's
//! own binary, with no `nimbus` installed and no other version of it
//! picked up from `PATH`.

mod actors;
mod chaos;
mod head_args;
mod jobs;
mod logs;
mod memory;
mod plot;
mod start;
mod state;
mod status;
mod stop;
mod tickets;
mod up;

use clap::{Parser, Subcommand};

/// nimbus: distributed actors and training in one static binary.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: boxing `Start`'s flags would save no memory.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start a node (the head with --head) and leave it running in the background.
    Start(start::StartArgs),
    /// List the cluster's nodes with their state and resources.
    Status(status::StatusArgs),
    /// Stop the nodes this machine started.
    Stop(stop::StopArgs),
    /// List what every node's object store holds.
    Memory(memory::MemoryArgs),
    /// Run a program against a local cluster under a seeded fault plan.
    Chaos(chaos::ChaosArgs),
    /// List actors, nodes, objects, jobs, placement groups or tasks, with filters, as a table or JSON.
    List(actors::ListArgs),
    /// Print an actor's log (its stdout and stderr), a job's or a node's, from the node that has it.
    Logs(logs::LogsArgs),
    /// Kill an actor for good (no restart), by name or id.
    Kill(actors::KillArgs),
    /// Submit driver programs to run on the cluster, list, follow and stop them.
    #[command(subcommand)]
    Job(jobs::JobCommand),
    /// Draw a training run's losses (its metrics.jsonl) into its loss.svg.
    Plot(plot::PlotArgs),
    /// Start a head and an autoscaler that launches and stops nodes as a cluster config says.
    Up(up::UpArgs),
    /// Stop what `nimbus up` started: the autoscaler, the nodes it launched, the head.
    Down(up::DownArgs),
    /// Make the head rotate its ticket key; nodes and workers take the new one up as they renew.
    RotateTicketKey(tickets::RotateArgs),
}

/// The `nimbus` command line: parses this process's arguments, runs the
/// command, and exits (1 with the error on stderr, if it fails).
pub fn main() -> ! {
    exit_with(Cli::parse())
}

/// The command line of a program started with [`crate::runtime::NODE_ARG`]
/// first: the arguments after it are `nimbus`'s.
pub fn run_as_node() -> ! {
    let args = std::env::args_os()
        .take(1)
        .chain(std::env::args_os().skip(2));
    exit_with(Cli::parse_from(args))
}

fn exit_with(cli: Cli) -> ! {
    if !matches!(
        cli.command,
        Command::Start(_) | Command::Chaos(_) | Command::Up(_)
    ) {
        // A command that only prints ends quietly when its reader goes
        // (`nimbus status --json | head -1`), as other Unix tools do,
        // instead of panicking on the broken pipe. Not a node, a chaos
        // run or an autoscaler: they write to sockets and children for
        // their whole life (a launch program that exits without reading
        // the token on its stdin must not kill the autoscaler).
        // SAFETY: setting a signal's disposition to its default, before
        // any thread of ours runs.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Start(args) => start::run(args),
        Command::Status(args) => status::run(args),
        Command::Stop(args) => stop::run(args),
        Command::Memory(args) => memory::run(args),
        Command::Chaos(args) => chaos::run(args),
        Command::List(args) => actors::list(args),
        Command::Logs(args) => logs::logs(args),
        Command::Kill(args) => actors::kill(args),
        Command::Job(command) => jobs::run(command),
        Command::Plot(args) => plot::run(args),
        Command::Up(args) => up::up(args),
        Command::Down(args) => up::down(args),
        Command::RotateTicketKey(args) => tickets::rotate(args),
    };
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Logs go to stderr, filtered by `NIMBUS_LOG` (default `info`).
fn init_logging() {
    crate::runtime::logging::install();
}
