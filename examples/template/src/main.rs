//! A standalone program on nimbus: one actor and one task.
//!
//! ```text
//! cargo run --release                   # joins the head of `nimbus start --head` on this
//!                                       # machine, else starts a private local cluster
//!                                       # whose nodes run this very program (nothing
//!                                       # else to install)
//! cargo run --release -- --address HOST:PORT --token-file FILE   # any cluster
//! ```
//!
//! You will see the actor's greeting, then
//! `summary: greeting="hello, nimbus" square=49`.

use actix::prelude::*;
use nimbus::actor::{self, Registry, SpawnOptions};
use nimbus::object_store;
use nimbus::task::{self, Input, TaskFn, TaskOptions};
use serde::{Deserialize, Serialize};

/// An actor: it lives in a worker process of its own, on any node.
struct Greeter {
    greeting: String,
}

impl Actor for Greeter {
    type Context = Context<Self>;
}

/// A message to it, with its reply type.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "String")]
struct Greet(String);

impl Handler<Greet> for Greeter {
    type Result = String;
    fn handle(&mut self, Greet(name): Greet, _: &mut Context<Self>) -> String {
        format!("{}, {name}", self.greeting)
    }
}

// Remote, under stable names (module path and type), and registered in
// every process of this program: `nimbus::init` collects them. A message
// listed here that `Greeter` does not handle is a compile error.
nimbus::remote_message!(Greet);
nimbus::remote_actor!(Greeter, args: String, new: |greeting| Greeter { greeting }, handles: [Greet]);

/// A task: a function run on a leased worker process, its result an object.
const SQUARE: TaskFn<u64, u64> = TaskFn::new("template.square");
nimbus::remote_task!(SQUARE, |n: u64| Ok::<_, String>(n * n));

fn main() -> anyhow::Result<()> {
    // In a worker process `init` hosts the actor or runs tasks, and never
    // returns; here it makes this program a driver. (`Registry::new()`
    // holds nothing: the macros above registered everything.)
    let driver = nimbus::init(Registry::new())?;
    // Connects, then runs the work; if it fails, a private local cluster's
    // logs are kept (and where is printed).
    driver.block_on(async {
        let greeter = actor::spawn::<Greeter>("hello".into(), SpawnOptions::default()).await?;
        let greeting = greeter.send(Greet("nimbus".into())).await?;
        println!("{greeting}");
        let square = task::submit(SQUARE, Input::value(&7u64)?, TaskOptions::default()).await?;
        let square = object_store::get(&square).await?;
        println!("summary: greeting={greeting:?} square={square}");
        Ok(())
    })
}
