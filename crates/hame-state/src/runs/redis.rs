//! [`RedisRunQueue`]: the run queue on Redis Streams. A run that is the head of its
//! session is an entry of its agent's stream; workers claim with `XREADGROUP` in one
//! consumer group and take over a dead worker's entries with `XAUTOCLAIM` once its claim
//! lapsed. Run records are hashes; every step is one Lua script, so it is atomic.
//!
//! Keys (`{runs}` is a cluster hash tag: the whole queue lives in one slot, so the scripts
//! may touch any of its keys; `<tenant>` is `u=<user>` or `~` for the anonymous one):
//!
//! ```text
//! <prefix>:{runs}:run:<id>                        hash: the run (b = the run as submitted,
//!                                                 JSON; st, seq, at, tk, w, c, cr, up, ex,
//!                                                 reply, usage, error, approvals; e = its
//!                                                 stream entry; ag, sk = agent, session key)
//! <prefix>:{runs}:seq                             counter: the runs' seq
//! <prefix>:{runs}:stream:<agent>                  stream (group `workers`): session heads
//! <prefix>:{runs}:busy:<agent>:<tenant>:<session> string: the run at the session's head
//! <prefix>:{runs}:wait:<agent>:<tenant>:<session> list: the session's later queued runs
//! <prefix>:{runs}:idem:<agent>:<tenant>:<key>     string: the run of an Idempotency-Key
//! <prefix>:{runs}:lt:<agent>:<tenant>             sorted set: the tenant's runs by seq
//! <prefix>:{runs}:ls:<agent>:<tenant>:<session>   sorted set: the session's runs by seq
//! <prefix>:{runs}:done:<agent>                    sorted set: finished runs by end time (ms)
//! <prefix>:{runs}:wake                            stream (capped at about 1,000): one entry
//!                                                 per submit, finish and cancel
//! ```
//!
//! **One at a time per session, in order**: only a session's head is ever in the stream.
//! A submit to a busy session waits in the session's list; the finish (or cancel) of the
//! head moves the next queued run into the stream. So every entry a worker reads is
//! claimable, and the consumer group hands each to one worker.
//!
//! **Fencing**: a claim writes a new token and attempt into the run's hash; heartbeats and
//! the finish compare it. A heartbeat also `XCLAIM`s the run's entry back to its worker,
//! which resets the entry's idle time: an entry idle for a claimer's lapse belongs to a
//! worker that stopped heartbeating, and `XAUTOCLAIM` hands it over (the hash's expiry,
//! in the server's clock, decides).
//!
//! **Wake-ups**: idle workers block on the `wake` stream (`XREAD BLOCK`) on a connection of
//! their own, at most [`REDIS_POLL`] at a time, so a lapsed claim is found within that.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{
    Beat, CancelOutcome, Claim, ClaimOptions, Decided, Decision, EndColumns, NewRun, Run, RunEnd,
    RunError, RunFilter, RunQueue, Submitted, claim_lost, error_json, new_token, validate_run_id,
};
use crate::error::{Error, Result};
use crate::key::StateKey;
use crate::redis_store::{Conn, NOW, RedisOptions};

/// Longest an idle worker blocks on the wake-up stream before it looks for lapsed claims
/// (1 s).
pub const REDIS_POLL: Duration = Duration::from_secs(1);

/// The helpers every script starts with. ARGV[1] is the queue's key base
/// (`<prefix>:{runs}`).
const LIB: &str = r"
local B = ARGV[1]
local G = 'workers'
local function rk(id) return B .. ':run:' .. id end
local function stream(ag) return B .. ':stream:' .. ag end
local function wake(what)
  redis.call('XADD', B .. ':wake', 'MAXLEN', '~', 1000, '*', 'w', what)
end
-- The run became its session's head: it goes into its agent's stream.
local function offer(id, ag)
  local s = stream(ag)
  if redis.call('EXISTS', s) == 0 then
    redis.call('XGROUP', 'CREATE', s, G, '0', 'MKSTREAM')
  end
  local e = redis.call('XADD', s, '*', 'run', id)
  redis.call('HSET', rk(id), 'e', e)
end
-- The run ended at `t`: it joins the agent's finished runs, by time, for purging.
local function ended(id, t, ag)
  redis.call('ZADD', B .. ':done:' .. ag, t, id)
end
-- The run's stream entry is done with.
local function drop_entry(id, ag)
  local e = redis.call('HGET', rk(id), 'e')
  if e and e ~= '' then
    redis.call('XACK', stream(ag), G, e)
    redis.call('XDEL', stream(ag), e)
    redis.call('HSET', rk(id), 'e', '')
  end
end
-- The head `id` of session `sk` ended: the session's next queued run becomes its head.
local function advance(sk, id, ag)
  local busy = B .. ':busy:' .. sk
  if redis.call('GET', busy) ~= id then return end
  local wait = B .. ':wait:' .. sk
  while true do
    local nxt = redis.call('LPOP', wait)
    if not nxt then
      redis.call('DEL', busy)
      return
    end
    if redis.call('HGET', rk(nxt), 'st') == 'queued' then
      redis.call('SET', busy, nxt)
      offer(nxt, ag)
      return
    end
  end
end
";

/// ARGV: base, id, agent, session key, run JSON, idempotency key ('' = none), tenant key,
/// then, to claim the new run when its session is free: a token ('' = do not), the
/// consumer (the worker) and the lapse in ms. Returns {1, run} for a new run (or this
/// call, retried), {0, run} for the run of a repeated idempotency key; the run is claimed
/// when its `tk` is the token.
const SUBMIT: &str = r"
local id, ag, sk = ARGV[2], ARGV[3], ARGV[4]
if redis.call('EXISTS', rk(id)) == 1 then return {1, redis.call('HGETALL', rk(id))} end
if ARGV[6] ~= '' then
  local ik = B .. ':idem:' .. ARGV[7] .. ':' .. ARGV[6]
  local prev = redis.call('GET', ik)
  if prev then return {0, redis.call('HGETALL', rk(prev))} end
  redis.call('SET', ik, id)
end
local seq = redis.call('INCR', B .. ':seq')
local t = now()
redis.call('HSET', rk(id), 'b', ARGV[5], 'seq', seq, 'st', 'queued', 'tk', '', 'at', 0,
  'w', '', 'c', 0, 'cr', t, 'up', t, 'ex', '', 'e', '', 'ag', ag, 'sk', sk, 'tn', ARGV[7],
  'ik', ARGV[6])
redis.call('ZADD', B .. ':lt:' .. ARGV[7], seq, id)
redis.call('ZADD', B .. ':ls:' .. sk, seq, id)
local busy = B .. ':busy:' .. sk
if redis.call('EXISTS', busy) == 0 then
  redis.call('SET', busy, id)
  offer(id, ag)
  if ARGV[8] ~= '' then
    -- Claimed at once: its entry stays in the stream, so a reader leaves it pending and,
    -- once the claim lapses, a worker takes it over like any other.
    redis.call('HSET', rk(id), 'st', 'running', 'at', 1, 'tk', ARGV[8], 'w', ARGV[9],
      'ex', t + tonumber(ARGV[10]))
    return {1, redis.call('HGETALL', rk(id))}
  end
else
  redis.call('RPUSH', B .. ':wait:' .. sk, id)
end
wake('submit')
return {1, redis.call('HGETALL', rk(id))}
";

/// ARGV: base, agent, consumer (the worker), lapse ms, token. Returns the claimed run's
/// hash, or an empty array.
const CLAIM: &str = r"
local ag, me, lapse = ARGV[2], ARGV[3], tonumber(ARGV[4])
local s = stream(ag)
if redis.call('EXISTS', s) == 0 then return {} end
local t = now()
local function take(id)
  redis.call('HINCRBY', rk(id), 'at', 1)
  redis.call('HSET', rk(id), 'st', 'running', 'tk', ARGV[5], 'w', me, 'c', 0, 'up', t,
    'ex', t + lapse)
  return redis.call('HGETALL', rk(id))
end
local function done_with(e)
  redis.call('XACK', s, G, e)
  redis.call('XDEL', s, e)
end
-- The run of entry `e`: taken when queued or its claim lapsed; an ended run's entry is
-- dropped; a live claim's entry is left where it is (nil).
local function consider(e, id)
  local h = redis.call('HMGET', rk(id), 'st', 'ex')
  if h[1] == 'queued' or (h[1] == 'running' and (tonumber(h[2]) or 0) <= t) then
    return take(id)
  elseif h[1] ~= 'running' then
    done_with(e)
  end
  return nil
end
-- Entries nobody heartbeated for our lapse: taken over when the run's claim lapsed. One
-- entry per XAUTOCLAIM (an entry it returns is ours and its idle time starts again, so
-- taking many at once would hide the others from the next claimer for a whole lapse).
local cursor = '0-0'
for _ = 1, 100 do
  local ac = redis.call('XAUTOCLAIM', s, G, me, lapse, cursor, 'COUNT', 1)
  cursor = ac[1]
  local ent = ac[2][1]
  if type(ent) == 'table' and type(ent[2]) == 'table' then
    -- A live claim with a longer lapse than ours: its next heartbeat takes the entry back.
    local got = consider(ent[1], ent[2][2])
    if got then return got end
  end
  if cursor == '0-0' then break end
end
-- New entries: each is the head of its session, claimable unless it was cancelled.
for _ = 1, 100 do
  local r = redis.call('XREADGROUP', 'GROUP', G, me, 'COUNT', 1, 'STREAMS', s, '>')
  if not r then return {} end
  local ent = r[1][2][1]
  if not ent then return {} end
  -- Claimed when it was submitted (`submit_claimed`) and live: it stays pending here until
  -- its owner's heartbeat takes the entry (or its claim lapses and XAUTOCLAIM hands it on).
  local got = consider(ent[1], ent[2][2])
  if got then return got end
end
return {}
";

/// ARGV: base, id, token, lapse ms, consumer. Returns the cancel flag (0 or 1), or -1 when
/// the claim is not the run's current one.
const HEARTBEAT: &str = r"
local k = rk(ARGV[2])
local h = redis.call('HMGET', k, 'st', 'tk', 'c', 'e', 'ag')
if h[1] ~= 'running' or h[2] ~= ARGV[3] then return -1 end
redis.call('HSET', k, 'ex', now() + tonumber(ARGV[4]))
if h[4] and h[4] ~= '' then
  redis.call('XCLAIM', stream(h[5]), G, ARGV[5], 0, h[4], 'JUSTID')
end
return tonumber(h[3]) or 0
";

/// ARGV: base, id, token, status, then reply, usage, error, approvals (each '' when absent,
/// else '=' and the value). Returns the run's hash, or an empty array when the claim is
/// not the run's current one. A retried finish (the run's last token, the same status)
/// returns the run again, unchanged.
const FINISH: &str = r"
local id = ARGV[2]
local k = rk(id)
local h = redis.call('HMGET', k, 'st', 'tk', 'sk', 'ag', 'ft')
if h[1] ~= 'running' or h[2] ~= ARGV[3] then
  if h[5] == ARGV[3] and h[1] == ARGV[4] then return redis.call('HGETALL', k) end
  return {}
end
local t = now()
redis.call('HSET', k, 'st', ARGV[4], 'tk', '', 'ft', ARGV[3], 'ex', '', 'up', t)
local fields = {'reply', 'usage', 'error', 'approvals', 'verification'}
for i, f in ipairs(fields) do
  local v = ARGV[4 + i]
  if v ~= '' then redis.call('HSET', k, f, string.sub(v, 2)) end
end
drop_entry(id, h[4])
-- A run waiting for a decision is never purged and stays its session's head (`busy`):
-- the session's next run waits until a decision resumes it (DECIDE) or it is cancelled.
if ARGV[4] ~= 'waiting_approval' then
  ended(id, t, h[4])
  advance(h[3], id, h[4])
end
wake('finish')
return redis.call('HGETALL', k)
";

/// ARGV: base, id, error JSON of a cancelled run. Returns {0, {}} (no such run), {1, run}
/// (cancelled: it was queued or waiting for a decision), {2, run} (a running run, flagged)
/// or {3, run} (ended, unchanged).
const CANCEL: &str = r"
local id = ARGV[2]
local k = rk(id)
local h = redis.call('HMGET', k, 'st', 'sk', 'ag')
if not h[1] then return {0, {}} end
if h[1] == 'queued' or h[1] == 'waiting_approval' then
  local t = now()
  redis.call('HSET', k, 'st', 'cancelled', 'error', ARGV[3], 'up', t)
  ended(id, t, h[3])
  drop_entry(id, h[3])
  if redis.call('GET', B .. ':busy:' .. h[2]) == id then
    advance(h[2], id, h[3])
  else
    redis.call('LREM', B .. ':wait:' .. h[2], 0, id)
  end
  wake('cancel')
  return {1, redis.call('HGETALL', k)}
elseif h[1] == 'running' then
  redis.call('HSET', k, 'c', 1, 'up', now())
  redis.call('PUBLISH', B .. ':cancel', id)
  wake('cancel')
  return {2, redis.call('HGETALL', k)}
end
return {3, redis.call('HGETALL', k)}
";

/// ARGV: base, session key, run id, the run's approvals as read (compared: a change since
/// means another decision came first), its approvals with the decision, token, consumer,
/// lapse ms. Returns {0, {}} when the run is no longer the session's waiting head or its
/// approvals changed (read again), else {1, run}: decided and claimed, its entry back in
/// the stream (left pending to whoever reads it while the claim is live, like a
/// submit-claimed run's).
const DECIDE: &str = r"
local id = ARGV[3]
local k = rk(id)
if redis.call('GET', B .. ':busy:' .. ARGV[2]) ~= id then return {0, {}} end
local h = redis.call('HMGET', k, 'st', 'approvals', 'ag')
if h[1] ~= 'waiting_approval' or (h[2] or '') ~= ARGV[4] then return {0, {}} end
local t = now()
redis.call('HINCRBY', k, 'at', 1)
redis.call('HSET', k, 'approvals', ARGV[5], 'st', 'running', 'tk', ARGV[6], 'w', ARGV[7],
  'c', 0, 'up', t, 'ex', t + tonumber(ARGV[8]))
offer(id, h[3])
return {1, redis.call('HGETALL', k)}
";

/// ARGV: base, agent, before (ms), limit. Deletes the agent's finished runs that ended
/// before `before`, oldest first; returns how many.
const PURGE: &str = r"
local done = B .. ':done:' .. ARGV[2]
local old = redis.call('ZRANGEBYSCORE', done, '-inf', '(' .. ARGV[3], 'LIMIT', 0,
  tonumber(ARGV[4]))
for _, id in ipairs(old) do
  local h = redis.call('HMGET', rk(id), 'sk', 'tn', 'ik')
  if h[1] and h[2] then
    redis.call('ZREM', B .. ':ls:' .. h[1], id)
    redis.call('ZREM', B .. ':lt:' .. h[2], id)
    if h[3] and h[3] ~= '' then
      local ik = B .. ':idem:' .. h[2] .. ':' .. h[3]
      if redis.call('GET', ik) == id then redis.call('DEL', ik) end
    end
    redis.call('DEL', rk(id))
  end
  redis.call('ZREM', done, id)
end
return #old
";

fn script(body: &str) -> redis::Script {
    redis::Script::new(&format!("{NOW}{LIB}{body}"))
}

static SUBMIT_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(SUBMIT));
static CLAIM_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(CLAIM));
static HEARTBEAT_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(HEARTBEAT));
static FINISH_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(FINISH));
static CANCEL_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(CANCEL));
static PURGE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(PURGE));
static DECIDE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| script(DECIDE));

/// Decisions read again after another decision on the same run came first.
const DECIDE_RETRIES: usize = 5;

fn backend(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::backend("redis", e)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn tenant(user: Option<&str>) -> String {
    user.map_or_else(|| "~".to_owned(), |u| format!("u={u}"))
}

type Hash = HashMap<String, String>;

fn time(h: &Hash, f: &str) -> Result<Option<DateTime<Utc>>> {
    match h.get(f).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .and_then(DateTime::from_timestamp_millis)
            .map(Some)
            .ok_or_else(|| backend(format!("bad time {v:?} in run field {f}"))),
    }
}

fn json(h: &Hash, f: &str) -> Result<Option<serde_json::Value>> {
    super::parse_json("redis", h.get(f).map(String::as_str))
}

fn number(h: &Hash, f: &str) -> Result<u64> {
    let v = h.get(f).map_or("0", String::as_str);
    v.parse()
        .map_err(|_| backend(format!("bad number {v:?} in run field {f}")))
}

/// A run from its hash: the run as submitted, overlaid with what changed since.
fn to_run(h: &Hash) -> Result<Run> {
    let base = h
        .get("b")
        .ok_or_else(|| backend("a run hash without its run"))?;
    let mut run: Run = serde_json::from_str(base).map_err(backend)?;
    run.status = super::parse_status("redis", h.get("st").map_or("", String::as_str))?;
    run.seq = number(h, "seq")?;
    run.attempts = number(h, "at")?;
    run.worker = h.get("w").filter(|w| !w.is_empty()).cloned();
    run.cancel_requested = h.get("c").is_some_and(|c| c == "1");
    run.created = time(h, "cr")?.unwrap_or(run.created);
    run.updated = time(h, "up")?.unwrap_or(run.updated);
    run.expires = time(h, "ex")?;
    run.token = h.get("tk").cloned().unwrap_or_default();
    run.reply = h.get("reply").cloned();
    run.usage = json(h, "usage")?;
    run.approvals = json(h, "approvals")?;
    run.verification = json(h, "verification")?;
    run.error = super::parse_error("redis", h.get("error").map(String::as_str))?;
    Ok(run)
}

/// The run queue on Redis Streams (see the module docs for the keys). Shares the state
/// store's URL and prefix ([`RedisOptions::prefix`]); see `docs/replicas.md`.
pub struct RedisRunQueue {
    conn: Conn,
    client: redis::Client,
    base: Arc<str>,
    target: Arc<str>,
    /// The blocking connection of `wait_for_work` and the last wake-up entry it saw.
    waiter: tokio::sync::Mutex<Option<(redis::aio::MultiplexedConnection, String)>>,
    cancels: super::CancelWatch,
}

impl std::fmt::Debug for RedisRunQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisRunQueue")
            .field("target", &self.target)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl RedisRunQueue {
    /// Connects to `url` (`redis://`, `rediss://`); the queue's keys start with
    /// `<options.prefix>:{runs}`.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        let (client, conn) = Conn::connect(url, &options).await?;
        Ok(Self {
            conn,
            client,
            base: format!("{}:{{runs}}", options.prefix).into(),
            target: crate::redact_url(url).into(),
            waiter: tokio::sync::Mutex::new(None),
            cancels: super::CancelWatch::new(),
        })
    }

    fn run_key(&self, id: &str) -> String {
        format!("{}:run:{id}", self.base)
    }

    async fn hash(&self, id: &str) -> Result<Option<Run>> {
        let h: Hash = self
            .conn
            .query(redis::cmd("HGETALL").arg(self.run_key(id)))
            .await?;
        if h.is_empty() {
            return Ok(None);
        }
        to_run(&h).map(Some)
    }

    /// The blocking connection for wake-ups and the id after which to read.
    async fn waiter(&self) -> Result<(redis::aio::MultiplexedConnection, String)> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(None);
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(backend)?;
        let last: Vec<(String, HashMap<String, String>)> = redis::cmd("XREVRANGE")
            .arg(format!("{}:wake", self.base))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let from = last
            .into_iter()
            .next()
            .map_or_else(|| "0-0".into(), |e| e.0);
        Ok((conn, from))
    }

    /// Stores a new run; with a token and options, claims it when its session is free.
    async fn submit_with(
        &self,
        new: &NewRun,
        claim: Option<(&str, &ClaimOptions)>,
    ) -> Result<Submitted> {
        let run = Run::new(new, Utc::now());
        let body = serde_json::to_string(&run).map_err(Error::Serialize)?;
        let t = tenant(new.key.user());
        let mut call = SUBMIT_SCRIPT.prepare_invoke();
        call.arg(&*self.base)
            .arg(&run.id)
            .arg(&run.agent)
            .arg(format!("{}:{t}:{}", run.agent, run.session))
            .arg(body)
            .arg(run.idempotency_key.as_deref().unwrap_or(""))
            .arg(format!("{}:{t}", run.agent));
        match claim {
            Some((token, options)) => call.arg(token).arg(&options.worker).arg(ms(options.lapse)),
            None => call.arg("").arg("").arg(0),
        };
        let (created, h): (i64, Hash) = self.conn.invoke(&call).await?;
        Ok(Submitted {
            run: to_run(&h)?,
            created: created == 1,
        })
    }
}

#[async_trait]
impl RunQueue for RedisRunQueue {
    async fn submit(&self, new: NewRun) -> Result<Submitted> {
        self.submit_with(&new, None).await
    }

    async fn submit_claimed(
        &self,
        new: NewRun,
        options: &ClaimOptions,
    ) -> Result<(Submitted, Option<Claim>)> {
        let token = new_token();
        let submitted = self.submit_with(&new, Some((&token, options))).await?;
        let claim = (submitted.run.status == super::RunStatus::Running
            && submitted.run.token == token)
            .then(|| Claim::of(submitted.run.clone(), token, options));
        Ok((submitted, claim))
    }

    async fn get(&self, id: &str) -> Result<Option<Run>> {
        if validate_run_id(id).is_err() {
            return Ok(None);
        }
        self.hash(id).await
    }

    async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
        let RunFilter {
            agent,
            user,
            session,
            limit,
        } = filter;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let t = tenant(user);
        let index = match session {
            Some(s) => format!("{}:ls:{agent}:{t}:{s}", self.base),
            None => format!("{}:lt:{agent}:{t}", self.base),
        };
        let ids: Vec<String> = self
            .conn
            .query(
                redis::cmd("ZREVRANGE")
                    .arg(index)
                    .arg(0)
                    .arg(i64::try_from(limit - 1).unwrap_or(i64::MAX)),
            )
            .await?;
        let mut runs = Vec::with_capacity(ids.len());
        for id in ids {
            // A run deleted between the two reads is left out.
            if let Some(run) = self.hash(&id).await? {
                runs.push(run);
            }
        }
        Ok(runs)
    }

    async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
        let token = new_token();
        let mut call = CLAIM_SCRIPT.prepare_invoke();
        call.arg(&*self.base)
            .arg(&options.agent)
            .arg(&options.worker)
            .arg(ms(options.lapse))
            .arg(&token);
        let h: Hash = self.conn.invoke(&call).await?;
        if h.is_empty() {
            return Ok(None);
        }
        Ok(Some(Claim::of(to_run(&h)?, token, options)))
    }

    async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
        let mut call = HEARTBEAT_SCRIPT.prepare_invoke();
        call.arg(&*self.base)
            .arg(&claim.run.id)
            .arg(&claim.token)
            .arg(ms(claim.lapse))
            .arg(claim.run.worker.as_deref().unwrap_or("worker"));
        let flag: i64 = self.conn.invoke(&call).await?;
        if flag < 0 {
            return Err(claim_lost(&claim.run.id));
        }
        Ok(Beat {
            cancel_requested: flag == 1,
        })
    }

    async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
        let cols = EndColumns::of(&claim.run, end)?;
        let mut call = FINISH_SCRIPT.prepare_invoke();
        call.arg(&*self.base)
            .arg(&claim.run.id)
            .arg(&claim.token)
            .arg(cols.status);
        for v in cols.values() {
            // '' when absent, else '=' and the value.
            call.arg(v.map(|v| format!("={v}")).unwrap_or_default());
        }
        let h: Hash = self.conn.invoke(&call).await?;
        if h.is_empty() {
            return Err(claim_lost(&claim.run.id));
        }
        to_run(&h)
    }

    async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
        if validate_run_id(id).is_err() {
            return Ok(CancelOutcome::NotFound);
        }
        let error = error_json(&RunError::cancelled())?;
        let mut call = CANCEL_SCRIPT.prepare_invoke();
        call.arg(&*self.base).arg(id).arg(error);
        let (code, h): (i64, Hash) = self.conn.invoke(&call).await?;
        if code == 0 || h.is_empty() {
            return Ok(CancelOutcome::NotFound);
        }
        let run = to_run(&h)?;
        Ok(match code {
            1 => CancelOutcome::Cancelled(run),
            2 => CancelOutcome::Requested(run),
            _ => CancelOutcome::Finished(run),
        })
    }

    async fn decide(
        &self,
        key: &StateKey,
        decision: &Decision,
        options: &ClaimOptions,
    ) -> Result<Decided> {
        let sk = format!("{}:{}:{}", key.agent(), tenant(key.user()), key.session());
        for _ in 0..DECIDE_RETRIES {
            let head: Option<String> = self
                .conn
                .query(redis::cmd("GET").arg(format!("{}:busy:{sk}", self.base)))
                .await?;
            let h: Hash = match &head {
                Some(id) => {
                    self.conn
                        .query(redis::cmd("HGETALL").arg(self.run_key(id)))
                        .await?
                }
                None => Hash::new(),
            };
            // Compared by the script: another decision in between makes us read again.
            let as_read = h.get("approvals").cloned().unwrap_or_default();
            let head = if h.is_empty() {
                None
            } else {
                Some(to_run(&h)?)
            };
            let (run, approvals) = match super::decide_on(head, decision) {
                Ok(decided) => decided,
                Err(answer) => return Ok(*answer),
            };
            let token = new_token();
            let mut call = DECIDE_SCRIPT.prepare_invoke();
            call.arg(&*self.base)
                .arg(&sk)
                .arg(&run.id)
                .arg(as_read)
                .arg(approvals.to_string())
                .arg(&token)
                .arg(&options.worker)
                .arg(ms(options.lapse));
            let (code, h): (i64, Hash) = self.conn.invoke(&call).await?;
            if code == 1 && !h.is_empty() {
                return Ok(Decided::Claimed(Claim::of(to_run(&h)?, token, options)));
            }
        }
        Err(backend(
            "a decision kept racing other decisions on the same run; try again",
        ))
    }

    async fn purge_finished(
        &self,
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<usize> {
        if limit == 0 {
            return Ok(0);
        }
        let mut call = PURGE_SCRIPT.prepare_invoke();
        call.arg(&*self.base)
            .arg(agent)
            .arg(before.timestamp_millis())
            .arg(limit);
        let n: u64 = self.conn.invoke(&call).await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn wait_for_work(&self, max: Duration) -> Result<()> {
        let max = max.min(REDIS_POLL);
        let mut guard = self.waiter.lock().await;
        if guard.is_none() {
            match self.waiter().await {
                Ok(w) => *guard = Some(w),
                Err(e) => tracing::debug!(error = %e, "run queue: no wake-up connection; polling"),
            }
        }
        let Some((conn, from)) = guard.as_mut() else {
            drop(guard);
            tokio::time::sleep(max).await;
            return Ok(());
        };
        let read: redis::RedisResult<Option<Vec<(String, Vec<(String, Hash)>)>>> =
            redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(ms(max))
                .arg("COUNT")
                .arg(100)
                .arg("STREAMS")
                .arg(format!("{}:wake", self.base))
                .arg(from.as_str())
                .query_async(conn)
                .await;
        match read {
            Ok(Some(streams)) => {
                if let Some(last) = streams
                    .into_iter()
                    .flat_map(|(_, entries)| entries)
                    .map(|(id, _)| id)
                    .next_back()
                {
                    *from = last;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "run queue: wake-up connection lost; polling");
                *guard = None;
                drop(guard);
                tokio::time::sleep(max).await;
            }
        }
        Ok(())
    }

    async fn wait_for_cancel(&self, id: &str, max: Duration) -> Result<()> {
        let (client, channel) = (self.client.clone(), format!("{}:cancel", self.base));
        self.cancels
            .start_once(|tx| listen_cancels(client, channel, tx));
        self.cancels.wait(id, max).await;
        Ok(())
    }

    fn is_shared(&self) -> bool {
        true
    }
}

/// Subscribes to the queue's cancel channel on a connection of its own, forwarding each
/// run id to `tx`; reconnects after a second when the connection breaks.
async fn listen_cancels(
    client: redis::Client,
    channel: String,
    tx: tokio::sync::broadcast::Sender<String>,
) {
    use futures::StreamExt as _;
    loop {
        match client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    let mut messages = pubsub.on_message();
                    while let Some(m) = messages.next().await {
                        if let Ok(id) = m.get_payload::<String>() {
                            let _ = tx.send(id);
                        }
                    }
                    tracing::debug!("run queue: cancel subscription lost; reconnecting");
                }
                Err(e) => tracing::debug!(error = %e, "run queue: SUBSCRIBE failed; retrying"),
            },
            Err(e) => tracing::debug!(error = %e, "run queue: no pub/sub connection; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
