//! The program's entry points, registered under stable names: actor and
//! message types, so that a worker process can build an actor from
//! serialized constructor arguments and route serialized messages to the
//! right handler, and one table per feature built on the runtime (task
//! functions, training loops), which a feature adds through
//! [`Registry::extend`] and reads through [`Registry::table`].
//!
//! A hosted actor takes the calls of other processes from a queue of its
//! own, beside actix's mailbox:
//!
//! 1. [`Registry::dispatch`] decodes the message on the caller's thread
//!    (the worker's transport thread) and queues it at once, so the
//!    queue's order is the calls' order.
//! 2. On the actor's thread, a future spawned in its context at creation
//!    ([`Calls`]) runs the queued calls one by one, at most
//!    [`CALLS_PER_POLL`] before letting the thread's other work run, and
//!    none while a handler has the context waiting (`ctx.wait`), as
//!    actix's mailbox does; a call whose caller no longer waits (its
//!    deadline passed) is skipped, as actix skips a message whose reply
//!    was dropped. The actor's context polls this future after its
//!    mailbox: calls from other processes keep their order among
//!    themselves, not against messages sent within the process.
//! 3. Right after each handler, on that thread, a result that is ready is
//!    encoded and handed to the call's [`ReplyTo`]: its reply can go out
//!    from there, before the next call is handled and with no hand-over
//!    to another thread. A result still to come (a handler returning a
//!    future), or one whose references must be delivered first
//!    (`transits.rs`), is handed over as a future instead.
//! 4. A call that can no longer run (the actor stopped, or its thread
//!    panicked) drops its `ReplyTo`, which answers `ActorGone`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use actix::dev::MessageResponse;
use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::{de::DeserializeOwned, Serialize};

/// The actix mailbox capacity of hosted actors: beyond any sane in-flight
/// limit (a full mailbox holds a message back in its reply future, where
/// later ones can overtake it; calls from other processes do not use the
/// mailbox, but messages within the process do).
const MAILBOX_CAPACITY: usize = 1 << 30;

/// Calls from other processes run in one poll of the actor (step 2)
/// before the thread's other work gets a turn.
const CALLS_PER_POLL: usize = 64;

/// A registration made where a type is defined ([`remote_actor!`],
/// [`remote_task!`]), collected at link time and added by `init`
/// ([`Registry::with_submitted`]).
///
/// [`remote_actor!`]: crate::remote_actor
/// [`remote_task!`]: crate::remote_task
pub struct Registration(pub fn(Registry) -> Registry);

inventory::collect!(Registration);

/// Makes message types remote: each one's stable name is its module path
/// and type name (`my_crate::bank::Deposit`).
///
/// ```
/// use nimbus::actix::prelude::*;
/// # use serde::{Deserialize, Serialize};
/// #[derive(Message, Serialize, Deserialize)]
/// #[rtype(result = "i64")]
/// struct Add(i64);
/// nimbus::remote_message!(Add);
/// use nimbus::actor::RemoteMessage;
/// assert!(<Add as RemoteMessage>::NAME.ends_with("::Add"));
/// ```
#[macro_export]
macro_rules! remote_message {
    ($($message:ident),+ $(,)?) => {
        $(
            impl $crate::runtime::RemoteMessage for $message {
                const NAME: &'static str = concat!(module_path!(), "::", stringify!($message));
            }
        )+
    };
}

/// Makes an actix actor remote and registers it with the messages it
/// handles, in every process of the program (no `Registry` to build;
/// [`init`](crate::init) collects it). Its stable name is its module path
/// and type name; `args` is what `nimbus::actor::spawn` takes and
/// a restart re-uses, `new` builds the actor from it. A listed message it
/// does not handle, or that is not remote, is a compile error.
///
/// ```
/// use nimbus::actix::prelude::*;
/// # use serde::{Deserialize, Serialize};
/// struct Counter(i64);
/// impl Actor for Counter { type Context = Context<Self>; }
///
/// #[derive(Message, Serialize, Deserialize)]
/// #[rtype(result = "i64")]
/// struct Add(i64);
/// impl Handler<Add> for Counter {
///     type Result = i64;
///     fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) -> i64 { self.0 += n; self.0 }
/// }
///
/// nimbus::remote_message!(Add);
/// nimbus::remote_actor!(Counter, args: i64, new: Counter, handles: [Add]);
///
/// let registry = nimbus::actor::Registry::new().with_submitted();
/// assert!(registry.has_actor(<Counter as nimbus::actor::RemoteActor>::NAME));
/// ```
#[macro_export]
macro_rules! remote_actor {
    ($actor:ident, args: $args:ty, new: $new:expr, handles: [$($message:ty),* $(,)?] $(,)?) => {
        impl $crate::runtime::RemoteActor for $actor {
            const NAME: &'static str = concat!(module_path!(), "::", stringify!($actor));
            type Args = $args;
            fn from_args(args: $args) -> Self {
                ($new)(args)
            }
        }
        $crate::__inventory::submit! {
            $crate::runtime::Registration(|registry| {
                registry.actor::<$actor>()$(.message::<$actor, $message>())*
            })
        }
    };
}

/// Values that can cross process boundaries.
pub trait Wire: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Wire for T {}

/// An actix actor that nimbus can run in a worker process.
///
/// ```
/// use actix::prelude::*;
/// use nimbus::actor::{RemoteActor, RemoteMessage};
/// use serde::{Deserialize, Serialize};
///
/// struct Counter(i64);
/// impl Actor for Counter { type Context = Context<Self>; }
/// impl RemoteActor for Counter {
///     const NAME: &'static str = "example.Counter";
///     type Args = i64;
///     fn from_args(start: i64) -> Self { Counter(start) }
/// }
///
/// #[derive(Message, Serialize, Deserialize)]
/// #[rtype(result = "i64")]
/// struct Add(i64);
/// impl RemoteMessage for Add { const NAME: &'static str = "example.Add"; }
/// impl Handler<Add> for Counter {
///     type Result = i64;
///     fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) -> i64 { self.0 += n; self.0 }
/// }
///
/// let registry = nimbus::actor::Registry::new().actor::<Counter>().message::<Counter, Add>();
/// ```
pub trait RemoteActor: Actor<Context = Context<Self>> {
    /// Stable name, the same in every build of the program that registers it.
    const NAME: &'static str;
    /// Constructor arguments, kept to re-create the actor on restart.
    type Args: Wire + Clone;
    /// Builds the actor.
    fn from_args(args: Self::Args) -> Self;
}

/// A message that can be sent to a [`RemoteActor`] in another process.
pub trait RemoteMessage: Message + Wire {
    /// Stable name, the same in every build of the program that registers it.
    const NAME: &'static str;
}

/// Why a call could not be dispatched inside the hosting process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// The message bytes are not a valid message of that type.
    Decode(String),
    /// This binary registers no handler for that message on that actor.
    UnknownMessage(String),
    /// The actor stopped (its thread panicked or it stopped itself).
    ActorGone,
    /// The reply could not be encoded.
    Encode(String),
}

type Create = Arc<dyn Fn(&[u8]) -> Result<HostedActor, DispatchError> + Send + Sync>;
type Dispatch = Arc<dyn Fn(&HostedActor, &[u8], ReplyTo) + Send + Sync>;

/// A reply, encoded: ready now, or to come.
pub enum Replied {
    /// Ready on the thread that runs the actor (step 3).
    Now(Result<Vec<u8>, DispatchError>),
    /// To come: a handler's future, or references to deliver first.
    Later(BoxFuture<'static, Result<Vec<u8>, DispatchError>>),
}

/// Where one call's reply goes (step 3).
pub trait ReplySink: Send {
    /// Takes the reply, on whichever thread has it; called once.
    fn send(self: Box<Self>, replied: Replied);

    /// Whether the caller still waits for the reply: a call no one waits
    /// for any more (its deadline passed) is not run, as actix does not
    /// run a message whose reply was dropped.
    fn wanted(&self) -> bool;
}

/// One call's [`ReplySink`]. Dropped unused, it answers `ActorGone`
/// (step 4).
pub struct ReplyTo(Option<Box<dyn ReplySink>>);

impl ReplyTo {
    /// Sends the reply to `sink`.
    pub fn new(sink: impl ReplySink + 'static) -> Self {
        ReplyTo(Some(Box::new(sink)))
    }

    fn send(mut self, replied: Replied) {
        if let Some(sink) = self.0.take() {
            sink.send(replied);
        }
    }

    fn wanted(&self) -> bool {
        self.0.as_ref().is_some_and(|sink| sink.wanted())
    }
}

/// `result`, encoded: ready now, or once the references it carries are
/// delivered (`transits.rs`).
fn encode_reply<T: Serialize>(result: &T) -> Replied {
    let (encoded, transits) = super::transits::encoding(|| crate::wire::encode_body(result, 0));
    let encoded = encoded.map_err(|e| DispatchError::Encode(e.to_string()));
    match transits.delivered() {
        None => Replied::Now(encoded),
        Some(delivered) => Replied::Later(
            async move {
                delivered.await;
                encoded
            }
            .boxed(),
        ),
    }
}

impl Drop for ReplyTo {
    fn drop(&mut self) {
        if let Some(sink) = self.0.take() {
            sink.send(Replied::Now(Err(DispatchError::ActorGone)));
        }
    }
}

/// A call queued for an actor of type `A` (step 1).
type Call<A> = Box<dyn FnOnce(&mut A, &mut Context<A>) + Send>;

/// Runs the calls queued for the actor whose context it is spawned in
/// (step 2).
struct Calls<A: Actor<Context = Context<A>>> {
    queue: tokio::sync::mpsc::UnboundedReceiver<Call<A>>,
}

impl<A: Actor<Context = Context<A>>> ActorFuture<A> for Calls<A> {
    type Output = ();

    fn poll(
        mut self: Pin<&mut Self>,
        actor: &mut A,
        ctx: &mut Context<A>,
        task: &mut std::task::Context<'_>,
    ) -> Poll<()> {
        for _ in 0..CALLS_PER_POLL {
            if ctx.waiting() {
                // The context polls its items again once the wait ends.
                return Poll::Pending;
            }
            match self.queue.poll_recv(task) {
                Poll::Ready(Some(call)) => call(actor, ctx),
                Poll::Ready(None) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
        task.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A running actor, type-erased: its `Addr`, and the queue of calls from
/// other processes.
#[derive(Clone)]
pub struct HostedActor {
    addr: Arc<dyn Any + Send + Sync>,
    calls: Arc<dyn Any + Send + Sync>,
}

impl HostedActor {
    /// The address, if the actor is of type `A`.
    pub fn addr<A: Actor>(&self) -> Option<&Addr<A>> {
        self.addr.downcast_ref()
    }

    fn calls<A: Actor<Context = Context<A>>>(
        &self,
    ) -> Option<&tokio::sync::mpsc::UnboundedSender<Call<A>>> {
        self.calls.downcast_ref()
    }
}

#[derive(Clone)]
struct ActorEntry {
    create: Create,
    handlers: HashMap<&'static str, Dispatch>,
}

/// Every actor and message type a program can host, by name, and the
/// tables of entry points of the features built on the runtime.
#[derive(Default, Clone)]
pub struct Registry {
    actors: HashMap<&'static str, ActorEntry>,
    /// One table per feature, by the table's type.
    tables: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds to this program's table of type `T`, created empty first: how a
    /// feature registers its own entry points (task functions, training
    /// loops) without the runtime knowing it.
    pub fn extend<T>(mut self, add: impl FnOnce(&mut T)) -> Self
    where
        T: Default + Clone + Send + Sync + 'static,
    {
        let mut table = self.table::<T>().cloned().unwrap_or_default();
        add(&mut table);
        self.tables.insert(TypeId::of::<T>(), Arc::new(table));
        self
    }

    /// This program's table of type `T`, if any entry was added to it.
    pub fn table<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.tables.get(&TypeId::of::<T>())?.downcast_ref()
    }

    /// Registers actor type `A`.
    pub fn actor<A: RemoteActor>(mut self) -> Self {
        let create: Create = Arc::new(|args: &[u8]| {
            let args: A::Args =
                rmp_serde::from_slice(args).map_err(|e| DispatchError::Decode(e.to_string()))?;
            // Calls are limited per handle (`max_in_flight`), not here.
            let actor = A::from_args(args);
            let (calls, queue) = tokio::sync::mpsc::unbounded_channel::<Call<A>>();
            let addr = A::create(|ctx: &mut Context<A>| {
                ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
                ctx.spawn(Calls { queue });
                actor
            });
            Ok(HostedActor {
                addr: Arc::new(addr),
                calls: Arc::new(calls),
            })
        });
        // Registered twice (by a macro and by hand): the handlers stay.
        self.actors.entry(A::NAME).or_insert(ActorEntry {
            create,
            handlers: HashMap::new(),
        });
        self
    }

    /// This registry with every registration the program's
    /// [`remote_actor!`](crate::remote_actor) and
    /// [`remote_task!`](crate::remote_task) made, wherever they are
    /// written (`init` adds them: a program cannot forget one).
    pub fn with_submitted(self) -> Self {
        inventory::iter::<Registration>
            .into_iter()
            .fold(self, |registry, registration| (registration.0)(registry))
    }

    /// Registers message `M` for actor `A` (register `A` first).
    ///
    /// # Panics
    /// If `A` was not registered: a programming error in `main`, caught the
    /// first time the program runs.
    pub fn message<A, M>(mut self) -> Self
    where
        A: RemoteActor + Handler<M>,
        M: RemoteMessage,
        M::Result: Wire,
    {
        let dispatch: Dispatch = Arc::new(|actor: &HostedActor, bytes: &[u8], reply: ReplyTo| {
            let Some(calls) = actor.calls::<A>() else {
                return reply.send(Replied::Now(Err(DispatchError::ActorGone)));
            };
            let message: M = match rmp_serde::from_slice(bytes) {
                Ok(message) => message,
                Err(e) => {
                    return reply.send(Replied::Now(Err(DispatchError::Decode(e.to_string()))))
                }
            };
            let call: Call<A> = Box::new(move |actor: &mut A, ctx: &mut Context<A>| {
                if !reply.wanted() {
                    return;
                }
                let (tx, mut rx) = tokio::sync::oneshot::channel();
                <A as Handler<M>>::handle(actor, message, ctx).handle(ctx, Some(tx));
                match rx.try_recv() {
                    Ok(result) => reply.send(encode_reply(&result)),
                    Err(tokio::sync::oneshot::error::TryRecvError::Closed) => drop(reply),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                        let later = async move {
                            let result = rx.await.map_err(|_| DispatchError::ActorGone)?;
                            match encode_reply(&result) {
                                Replied::Now(encoded) => encoded,
                                Replied::Later(encoded) => encoded.await,
                            }
                        };
                        reply.send(Replied::Later(later.boxed()));
                    }
                }
            });
            // Queued now, so calls keep their order; a call that cannot be
            // queued (the actor stopped) is dropped: `ActorGone`.
            let _ = calls.send(call);
        });
        let entry = self
            .actors
            .get_mut(A::NAME)
            .unwrap_or_else(|| panic!("register actor {} before its messages", A::NAME));
        entry.handlers.insert(M::NAME, dispatch);
        self
    }

    /// Whether actor type `name` is registered.
    pub fn has_actor(&self, name: &str) -> bool {
        self.actors.contains_key(name)
    }

    /// Starts actor `name` from serialized arguments, in the calling actix
    /// system.
    pub fn create(&self, name: &str, args: &[u8]) -> Result<HostedActor, DispatchError> {
        let entry = self.actors.get(name).ok_or_else(|| {
            DispatchError::UnknownMessage(format!(
                "actor type {name} is not registered in this binary"
            ))
        })?;
        (entry.create)(args)
    }

    /// Queues a serialized message for `actor` (of type `name`) now
    /// (step 1); its encoded reply, or why there is none, goes to `reply`.
    pub fn dispatch(
        &self,
        name: &str,
        actor: &HostedActor,
        message: &str,
        bytes: &[u8],
        reply: ReplyTo,
    ) {
        match self
            .actors
            .get(name)
            .and_then(|entry| entry.handlers.get(message))
        {
            Some(handler) => handler(actor, bytes, reply),
            None => reply.send(Replied::Now(Err(DispatchError::UnknownMessage(format!(
                "this binary registers no handler for message {message} on actor {name}"
            ))))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter(i64);
    impl Actor for Counter {
        type Context = Context<Self>;
    }

    #[derive(Message, serde::Serialize, serde::Deserialize)]
    #[rtype(result = "i64")]
    struct Add(i64);
    impl Handler<Add> for Counter {
        type Result = i64;
        fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) -> i64 {
            self.0 += n;
            self.0
        }
    }

    #[derive(Message, serde::Serialize, serde::Deserialize)]
    #[rtype(result = "i64")]
    struct Get;
    impl Handler<Get> for Counter {
        type Result = i64;
        fn handle(&mut self, _: Get, _: &mut Context<Self>) -> i64 {
            self.0
        }
    }

    crate::remote_message!(Add, Get);
    crate::remote_actor!(Counter, args: i64, new: Counter, handles: [Add]);

    #[test]
    fn a_macro_registration_is_collected_with_stable_names_and_keeps_hand_made_ones() {
        assert_eq!(
            <Counter as RemoteActor>::NAME,
            "nimbus::runtime::registry::tests::Counter"
        );
        assert_eq!(
            <Get as RemoteMessage>::NAME,
            "nimbus::runtime::registry::tests::Get"
        );
        assert!(!Registry::new().has_actor(<Counter as RemoteActor>::NAME));
        // By hand first (with a handler the macro does not list), then the
        // macro's: both handlers stay.
        let registry = Registry::new()
            .actor::<Counter>()
            .message::<Counter, Get>()
            .with_submitted();
        let entry = &registry.actors[<Counter as RemoteActor>::NAME];
        assert!(entry.handlers.contains_key(<Add as RemoteMessage>::NAME));
        assert!(entry.handlers.contains_key(<Get as RemoteMessage>::NAME));
    }
}
