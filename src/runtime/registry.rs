//! The program's entry points, registered under stable names: actor and
//! message types, so that a worker process can build an actor from
//! serialized constructor arguments and route serialized messages to the
//! right handler, and one table per feature built on the runtime (task
//! functions, training loops), which a feature adds through
//! [`Registry::extend`] and reads through [`Registry::table`].

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::{de::DeserializeOwned, Serialize};

/// The actix mailbox capacity of hosted actors: beyond any sane in-flight
/// limit (a full mailbox would break the ordering of calls).
const MAILBOX_CAPACITY: usize = 1 << 30;

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
type Dispatch = Arc<
    dyn Fn(
            &HostedActor,
            &[u8],
        ) -> Result<BoxFuture<'static, Result<Vec<u8>, DispatchError>>, DispatchError>
        + Send
        + Sync,
>;

/// A running actor, type-erased (its `Addr`).
#[derive(Clone)]
pub struct HostedActor {
    addr: Arc<dyn Any + Send + Sync>,
}

impl HostedActor {
    /// The address, if the actor is of type `A`.
    pub fn addr<A: Actor>(&self) -> Option<&Addr<A>> {
        self.addr.downcast_ref()
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
            // Calls are limited per handle (`max_in_flight`), not here: a
            // full actix mailbox would hold messages back in their reply
            // futures and let later ones overtake them.
            let actor = A::from_args(args);
            let addr = A::create(|ctx: &mut Context<A>| {
                ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
                actor
            });
            Ok(HostedActor {
                addr: Arc::new(addr),
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
        let dispatch: Dispatch = Arc::new(|actor: &HostedActor, bytes: &[u8]| {
            let addr = actor.addr::<A>().ok_or(DispatchError::ActorGone)?;
            let message: M =
                rmp_serde::from_slice(bytes).map_err(|e| DispatchError::Decode(e.to_string()))?;
            // `send` enqueues now, so messages keep the order of the calls.
            let reply = addr.send(message);
            Ok(async move {
                let reply = reply.await.map_err(|_| DispatchError::ActorGone)?;
                let (encoded, transits) =
                    super::transits::encoding(|| crate::wire::encode_body(&reply, 0));
                if let Some(delivered) = transits.delivered() {
                    delivered.await;
                }
                encoded.map_err(|e| DispatchError::Encode(e.to_string()))
            }
            .boxed())
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

    /// Enqueues a serialized message for `actor` (of type `name`) now and
    /// returns its serialized reply to come.
    pub fn dispatch(
        &self,
        name: &str,
        actor: &HostedActor,
        message: &str,
        bytes: &[u8],
    ) -> Result<BoxFuture<'static, Result<Vec<u8>, DispatchError>>, DispatchError> {
        let handler = self
            .actors
            .get(name)
            .and_then(|entry| entry.handlers.get(message))
            .ok_or_else(|| {
                DispatchError::UnknownMessage(format!(
                    "this binary registers no handler for message {message} on actor {name}"
                ))
            })?;
        handler(actor, bytes)
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
