//! A user's programs launch and stop nodes (a cloud's command line, a
//! scheduler's, anything): `launch` with the node's name, type, head and
//! `nimbus start` arguments in its environment and the token on its
//! standard input; `terminate` with the name and type. Each must finish
//! within the config's `timeout_s`; its output goes to the autoscaler's
//! log, line by line.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{LaunchSpec, Launched, NodeProvider, Records};
use crate::autoscaler::AutoscalerError;

/// The default `timeout_s` of the programs.
pub(super) const DEFAULT_TIMEOUT_S: u64 = 60;
/// The most output of a program kept for an error message.
const OUTPUT_KEPT: usize = 2000;

/// Nodes started and stopped by the user's programs.
pub struct CommandProvider {
    records: Records,
    launch: Vec<String>,
    terminate: Vec<String>,
    timeout: Duration,
}

impl CommandProvider {
    /// A provider running `launch` and `terminate` (program and arguments).
    pub fn new(
        records: Records,
        (launch, terminate): (Vec<String>, Vec<String>),
        timeout: Duration,
    ) -> Self {
        CommandProvider {
            records,
            launch,
            terminate,
            timeout,
        }
    }
}

/// Runs the program in `argv` that stops node `name` (with `env`), within
/// `timeout`.
pub(super) fn stop_with(
    timeout: Duration,
    argv: &[String],
    env: &[(&str, String)],
    name: &str,
) -> Result<(), AutoscalerError> {
    run_program(timeout, argv, env, None)
        .map(|_| ())
        .map_err(|detail| AutoscalerError::Terminate {
            node: name.to_string(),
            detail,
        })
}

/// Runs `argv` with `env`, `stdin` on its standard input, within
/// `timeout`: its output, or why it failed.
pub(super) fn run_program(
    timeout: Duration,
    argv: &[String],
    env: &[(&str, String)],
    stdin: Option<String>,
) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no program given")?;
    let mut child = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("NIMBUS_TOKEN")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let _ = writeln!(pipe, "{text}");
    }
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut pipe| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    })
    .collect();
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let output: String = readers.into_iter().filter_map(|r| r.join().ok()).collect();
    for line in output.lines() {
        tracing::info!("{program}: {line}");
    }
    let tail = |text: &str| {
        let start = text.len().saturating_sub(OUTPUT_KEPT);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].trim().to_string()
    };
    match status {
        Some(status) if status.success() => Ok(output),
        Some(status) => Err(format!("{program} {status}: {}", tail(&output))),
        None => Err(format!(
            "{program} did not finish within {} s (timeout_s); killed",
            timeout.as_secs()
        )),
    }
}

impl NodeProvider for CommandProvider {
    fn launch(&self, node: &LaunchSpec) -> Result<(), AutoscalerError> {
        let record = Launched::of(node);
        self.records.save(&record)?;
        let env = [
            ("NIMBUS_NODE_NAME", node.name.clone()),
            ("NIMBUS_NODE_TYPE", node.node_type.name.clone()),
            ("NIMBUS_ADDRESS", node.head.clone()),
            ("NIMBUS_NODE_ARGS", node.start_args().join(" ")),
        ];
        run_program(
            self.timeout,
            &self.launch,
            &env,
            Some(node.token.to_string()),
        )
        .map(|_| ())
        .map_err(|detail| {
            self.records.remove(&node.name);
            AutoscalerError::Launch {
                node: node.name.clone(),
                detail,
            }
        })
    }

    fn terminate(&self, name: &str) -> Result<(), AutoscalerError> {
        let node_type = self
            .records
            .get(name)
            .map(|r| r.node_type)
            .unwrap_or_default();
        let env = [
            ("NIMBUS_NODE_NAME", name.to_string()),
            ("NIMBUS_NODE_TYPE", node_type),
        ];
        stop_with(self.timeout, &self.terminate, &env, name)?;
        self.records.remove(name);
        Ok(())
    }

    fn list(&self) -> Vec<Launched> {
        self.records.load()
    }
}
