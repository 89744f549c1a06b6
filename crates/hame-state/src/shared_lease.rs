//! The lease protocol of the shared stores (Redis, PostgreSQL, MySQL), written once.
//!
//! A store keeps one lease record per key — token, fence, holder, expiry on the server's
//! clock — and never deletes it (a release blanks the token and expires it), so the fence
//! only grows. Taking a lease is one atomic "take it if free or lapsed" that returns the
//! record in place; if that is someone else's and its [`Holder`] is a process of this
//! machine that has exited, one compare-and-set on the old token and fence takes it over.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::Result;
use crate::holder::Holder;
use crate::key::StateKey;
use crate::store::LeaseGrant;

/// A lease as a shared store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    /// The holder's token; empty once released.
    pub(crate) token: String,
    pub(crate) fence: u64,
    /// [`Holder::to_record`] of the holder.
    pub(crate) holder: String,
}

/// The two atomic operations a shared store provides for [`try_take`].
#[async_trait]
pub(crate) trait LeaseTable: Send + Sync {
    /// Records a lease for `token` (fence: the old one plus one) if the key has none, or
    /// only a released or lapsed one; returns the record in place afterwards.
    async fn take_free(&self, claim: &Claim<'_>) -> Result<Option<LeaseRecord>>;

    /// Replaces `old` with a lease for `token` (fence `old.fence + 1`) if the record still
    /// has `old`'s token and fence; returns whether it did.
    async fn take_over(&self, claim: &Claim<'_>, old: &LeaseRecord) -> Result<bool>;
}

/// Who asks for the lease of `key`, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) key: &'a StateKey,
    pub(crate) token: &'a str,
    pub(crate) holder: &'a str,
    pub(crate) ttl: Duration,
}

/// One attempt to take the lease of `key`: the grant, or `None` while a live holder has it.
pub(crate) async fn try_take(
    table: &impl LeaseTable,
    key: &StateKey,
    ttl: Duration,
) -> Result<Option<LeaseGrant>> {
    let token = uuid::Uuid::new_v4().to_string();
    let holder = Holder::current().to_record();
    let requested_at = Instant::now();
    let claim = Claim {
        key,
        token: &token,
        holder: &holder,
        ttl,
    };
    let Some(current) = table.take_free(&claim).await? else {
        return Ok(None);
    };
    if current.token == token {
        return Ok(Some(LeaseGrant::new(
            token,
            current.fence,
            ttl,
            requested_at,
        )));
    }
    let Some(gone) = Holder::from_record(&current.holder).filter(Holder::is_gone) else {
        return Ok(None);
    };
    let requested_at = Instant::now();
    if !table.take_over(&claim, &current).await? {
        return Ok(None);
    }
    let fence = current.fence + 1;
    tracing::info!(%key, holder = %gone, fence, "took over the lease of an exited holder");
    Ok(Some(LeaseGrant::new(token, fence, ttl, requested_at)))
}
