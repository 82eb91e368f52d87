//! Fate sharing: an actor spawned by another actor dies with the
//! incarnation that spawned it; a detached one does not, nor one spawned
//! with `survives_spawner`.

use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{self, ActorHandle, RemoteMessage, SpawnOptions, Strategy};
use nimbus::cluster::DeathCause;
use serde::{Deserialize, Serialize};

use crate::fixtures::{Add, Boom, Counter};

/// Spawns a `Counter` named `name` from inside the actor (on node-2, for
/// the child to live on another node than its owner).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct SpawnCounter {
    pub name: String,
    pub lifetime: Lifetime,
}

/// How a child spawned by [`SpawnCounter`] lives.
#[derive(Clone, Copy, Serialize, Deserialize)]
pub enum Lifetime {
    /// With its owner.
    Owned,
    /// Beyond its job (`SpawnOptions::detached`).
    Detached,
    /// Beyond its owner, with its job (`SpawnOptions::survives_spawner`).
    SurvivesSpawner,
}

impl RemoteMessage for SpawnCounter {
    const NAME: &'static str = "tests.SpawnCounter";
}

impl Handler<SpawnCounter> for Counter {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, spawn: SpawnCounter, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let options = SpawnOptions::default()
                .num_cpus(0.1)
                .strategy(Strategy::Node("node-2".into()))
                .name(spawn.name);
            let options = match spawn.lifetime {
                Lifetime::Owned => options,
                Lifetime::Detached => options.detached(),
                Lifetime::SurvivesSpawner => options.survives_spawner(),
            };
            actor::spawn::<Counter>(0, options)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }
}

/// The next death of `actor` after event `seen`, within 30 s.
async fn death_of(actor: &ActorHandle<Counter>, seen: &mut u64) -> actor::ActorDied {
    tokio::time::timeout(Duration::from_secs(30), actor::next_death(actor, seen))
        .await
        .unwrap_or_else(|_| panic!("actor {} did not die within 30 s", actor.id()))
        .unwrap()
}

/// The actor named `name`.
async fn named(name: &str) -> ActorHandle<Counter> {
    actor::get_actor::<Counter>(name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no actor named {name}"))
}

/// The parent (on node-1, one restart allowed) spawns a child, a
/// detached child and a child that survives its spawner on node-2. The
/// parent panics and restarts: the child dies, its cause naming the
/// parent's incarnation; the other two live on. The parent's new incarnation spawns a child again, which
/// dies when the parent is killed for good.
pub async fn an_actor_dies_with_the_actor_that_spawned_it() {
    let parent_options = SpawnOptions::default()
        .num_cpus(0.1)
        .strategy(Strategy::Node("node-1".into()))
        .max_restarts(1);
    let parent = actor::spawn::<Counter>(0, parent_options).await.unwrap();
    let spawn = |name: &str, lifetime| SpawnCounter {
        name: name.into(),
        lifetime,
    };
    for (name, lifetime) in [
        ("owned-1", Lifetime::Owned),
        ("detached-1", Lifetime::Detached),
        ("survivor-1", Lifetime::SurvivesSpawner),
    ] {
        parent.send(spawn(name, lifetime)).await.unwrap().unwrap();
    }
    let (owned, detached) = (named("owned-1").await, named("detached-1").await);
    let survivor = named("survivor-1").await;
    assert_eq!(owned.send(Add(2)).await.unwrap(), 2);
    let first = parent.record().await.unwrap().incarnation;

    let mut seen = nimbus::library::last_event().await.unwrap();
    let _ = parent.send(Boom("the parent fails".into())).await;
    let death = death_of(&owned, &mut seen).await;
    assert!(!death.restarting, "{death:?}");
    match &death.reason {
        DeathCause::OwnerDied { owner, .. } => {
            assert_eq!((owner.actor, owner.incarnation), (parent.id(), first));
        }
        other => panic!("the owned child died of {other}"),
    }
    assert!(
        death.reason.to_string().contains(&parent.id().to_string()),
        "{}",
        death.reason
    );
    assert_eq!(detached.send(Add(3)).await.unwrap(), 3);
    assert_eq!(survivor.send(Add(5)).await.unwrap(), 5);

    // The restarted parent owns what it spawns anew.
    assert_eq!(parent.send(Add(1)).await.unwrap(), 1);
    parent
        .send(spawn("owned-2", Lifetime::Owned))
        .await
        .unwrap()
        .unwrap();
    let owned = named("owned-2").await;
    let mut seen = nimbus::library::last_event().await.unwrap();
    parent.kill().await.unwrap();
    let death = death_of(&owned, &mut seen).await;
    assert!(
        matches!(&death.reason, DeathCause::OwnerDied { owner, .. } if owner.actor == parent.id()),
        "{}",
        death.reason
    );
    assert_eq!(detached.send(Add(1)).await.unwrap(), 4);
    assert_eq!(survivor.send(Add(1)).await.unwrap(), 6);
    detached.kill().await.unwrap();
    survivor.kill().await.unwrap();
}
