//! Work after the reply is durable: the after-call flush and the throttled consolidation.

use std::sync::Arc;

use chrono::Utc;
use hame_core::AgentState;
use hame_fs::{Namespace, Scope};
use hame_memory::{
    CompactionState, ConsolidationOutcome, Consolidator, MemoryFiles, MemoryState, content_hash,
};
use hame_state::{LeaseOptions, StateKey, StateStore};
use hame_tools::Workspace;

use super::layer::MemoryLayer;
use super::{CONSOLIDATION_LEASE_TTL, MEMORY_LEASE_SESSION};

/// Why background memory work failed (logged; the next call redoes it).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackgroundError {
    #[error("state store: {0}")]
    State(#[from] hame_state::Error),
    #[error(transparent)]
    Memory(#[from] hame_memory::Error),
    #[error("invalid ids: {0}")]
    Ids(String),
    #[error("the flush watermark could not be saved after {0} conflicts")]
    Conflicts(usize),
}

/// Attempts to save the advanced watermark when another writer saved in between.
const SAVE_ATTEMPTS: usize = 3;

/// Messages after the flush watermark.
pub(crate) fn unflushed(state: &AgentState) -> u64 {
    let next = CompactionState::load(state).next_seq(state.messages.len());
    next.saturating_sub(MemoryState::load(state).watermark())
}

/// Starts the after-call work for a session; the CLI waits for it before exiting.
/// `unflushed` is [`unflushed`] of the state the call saved: below the flush threshold
/// nothing is started (the common case, which then costs no load of the state). At most
/// one is in flight per session: while one waits for the lease (the session's next call
/// holds it), later calls start none, and the one waiting flushes their messages too.
pub(crate) fn spawn_after_call(
    layer: &Arc<MemoryLayer>,
    store: Arc<dyn StateStore>,
    key: StateKey,
    ws: Workspace,
    lease: LeaseOptions,
    unflushed: u64,
) {
    if !layer.options.enabled
        || !layer.options.flush_policy.after_call
        || unflushed < (layer.options.flush_policy.min_new_messages.max(1) as u64)
    {
        return;
    }
    let Some(claim) = layer.claim_flush(&key) else {
        return;
    };
    let l = layer.clone();
    let task = tokio::spawn(async move {
        let _claim = claim;
        match after_call(&l, store.as_ref(), &key, &ws, lease).await {
            Ok(true) => {
                if let Err(e) = consolidate(&l, store.as_ref(), &ws).await {
                    tracing::warn!(error = %e, "memory consolidation failed; MEMORY.md unchanged");
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(session = %ws.identity().session, error = %e, "background memory flush failed; the next call redoes it");
            }
        }
    });
    layer.track(task);
}

/// Flushes the session if enough messages are unflushed. Holds the session lease, so it
/// never races a call of the same session; saves the watermark with compare-and-set.
/// Returns whether a flush ran. The caller's count decided to come here; the state is
/// loaded (and the count checked again) only under the lease.
async fn after_call(
    layer: &MemoryLayer,
    store: &dyn StateStore,
    key: &StateKey,
    ws: &Workspace,
    lease: LeaseOptions,
) -> Result<bool, BackgroundError> {
    let min = layer.options.flush_policy.min_new_messages.max(1) as u64;
    let held = match store.acquire(key, lease).await {
        Ok(l) => l,
        Err(hame_state::Error::SessionBusy { .. }) => {
            tracing::debug!(session = %ws.identity().session, "session busy; its next call flushes");
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let result = flush_leased(layer, store, key, ws, min, &held).await;
    if let Err(e) = held.release().await {
        tracing::warn!(error = %e, "releasing the session lease after the flush failed; it expires by itself");
    }
    result
}

async fn flush_leased(
    layer: &MemoryLayer,
    store: &dyn StateStore,
    key: &StateKey,
    ws: &Workspace,
    min: u64,
    held: &hame_state::Lease,
) -> Result<bool, BackgroundError> {
    let _alive = held.keep_alive();
    let Some(stored) = store.load(key).await? else {
        return Ok(false);
    };
    if unflushed(&stored.state) < min {
        return Ok(false);
    }
    let mut state = stored.state;
    let done = layer.flush(&mut state, ws).await?;
    tracing::debug!(session = %ws.identity().session, facts = done.facts, rounds = done.rounds, "memory flushed after the call");
    let ours = MemoryState::load(&state);
    let mut version = Some(stored.version);
    for _ in 0..SAVE_ATTEMPTS {
        match store.save_fenced(key, &state, version, held).await {
            Ok(_) => return Ok(true),
            Err(hame_state::Error::Conflict { .. }) => {
                // Someone saved in between (an expired lease): keep their state, advance
                // only the watermark.
                let Some(fresh) = store.load(key).await? else {
                    return Ok(true);
                };
                state = fresh.state;
                version = Some(fresh.version);
                let mut theirs = MemoryState::load(&state);
                if theirs.flushed_through >= ours.flushed_through {
                    return Ok(true);
                }
                theirs.flushed_through = ours.flushed_through;
                theirs.last_flush = ours.last_flush;
                theirs.store(&mut state)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(BackgroundError::Conflicts(SAVE_ATTEMPTS))
}

/// The lease key that lets one replica at a time consolidate a tenant's memory.
pub(crate) fn consolidation_key(
    layer: &MemoryLayer,
    ws: &Workspace,
) -> Result<StateKey, BackgroundError> {
    let scope = layer.scope;
    let id = ws.identity();
    let key = match (&id.user, scope) {
        (Some(user), Scope::User) => {
            StateKey::new(&layer.agent, Some(user.as_str()), MEMORY_LEASE_SESSION)
        }
        _ => {
            let ns = Namespace::derive(&layer.agent, id.user.as_deref(), &id.session, scope)
                .map_err(|e| BackgroundError::Ids(e.to_string()))?;
            let hash = content_hash(&ns.key('/'));
            StateKey::new(
                &layer.agent,
                None::<String>,
                format!("{MEMORY_LEASE_SESSION}-{}", &hash[..16]),
            )
        }
    };
    Ok(key?)
}

/// Consolidates the tenant's daily logs into `MEMORY.md` if the throttle allows and no
/// other replica is doing it.
pub(crate) async fn consolidate(
    layer: &MemoryLayer,
    store: &dyn StateStore,
    ws: &Workspace,
) -> Result<ConsolidationOutcome, BackgroundError> {
    let key = consolidation_key(layer, ws)?;
    let Some(lease) = store.try_acquire(&key, CONSOLIDATION_LEASE_TTL).await? else {
        tracing::debug!("another replica consolidates this memory");
        return Ok(ConsolidationOutcome::Throttled);
    };
    let files: Arc<dyn MemoryFiles> = Arc::new(layer.files(ws));
    let consolidator = Consolidator::new(
        files,
        layer.model.clone(),
        layer.counter.clone(),
        layer.options.consolidation.clone(),
    );
    let outcome = {
        let _alive = lease.keep_alive();
        consolidator.consolidate_if_due(Utc::now()).await
    };
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "releasing the consolidation lease failed; it expires by itself");
    }
    let outcome = outcome?;
    tracing::debug!(?outcome, "memory consolidation");
    Ok(outcome)
}
