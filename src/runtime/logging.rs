//! This process's logs: `tracing` events to stderr, filtered by
//! `NIMBUS_LOG` (default `info`); a driver's reach its terminal, a
//! worker's its log file on its node, a node's its own log. Once a process
//! knows who it is, every event carries it: `job=J actor=A node=N` in a
//! worker, `job=J` in a driver (`set_tags`), so lines from many logs can
//! be told apart once gathered.

use std::fmt;
use std::sync::OnceLock;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{DefaultFields, Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The fields every event of this process carries, once known.
static TAGS: OnceLock<String> = OnceLock::new();

/// Installs the subscriber (a program that installed one of its own keeps
/// it).
pub fn install() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NIMBUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .event_format(Tagged(Format::default()))
        .fmt_fields(DefaultFields::new())
        .try_init();
}

/// Sets the fields every later event of this process carries (once; a
/// second call is ignored): e.g. `[("job", "0badf00d"), ("actor", ..)]`.
pub fn set_tags(tags: &[(&str, &str)]) {
    let text: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = TAGS.set(text.join(" "));
}

/// The default format with this process's tags first.
struct Tagged<F>(F);

impl<S, N, F> FormatEvent<S, N> for Tagged<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if let Some(tags) = TAGS.get() {
            write!(writer, "{tags} ")?;
        }
        self.0.format_event(ctx, writer, event)
    }
}
