//! The single-machine queues: [`InMemoryRunQueue`] (one process) and `JsonRunQueue` (the
//! processes of one host, one file per run under an OS lock). Both apply the same
//! operations ([`ops`]) to the list of runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use super::{
    Beat, CancelOutcome, Claim, ClaimOptions, Decided, Decision, NewRun, Run, RunEnd, RunFilter,
    RunQueue, RunStatus, Submitted, claim_lost, new_token, validate_run_id,
};
use crate::error::Result;
use crate::key::StateKey;

/// How often an idle worker of a JSON queue looks for work (100 ms).
pub const LOCAL_POLL: Duration = Duration::from_millis(100);

/// The operations, over all runs; each returns its answer and the index of the run it
/// changed, if any.
pub(crate) mod ops {
    use super::*;

    pub(crate) fn lapse_delta(lapse: Duration) -> TimeDelta {
        TimeDelta::from_std(lapse).unwrap_or(TimeDelta::MAX)
    }

    pub(crate) fn submit(
        runs: &mut Vec<Run>,
        new: &NewRun,
        now: DateTime<Utc>,
    ) -> (Submitted, Option<usize>) {
        if let Some(k) = &new.idempotency_key
            && let Some(r) = runs.iter().find(|r| {
                r.idempotency_key.as_ref() == Some(k)
                    && r.is_owned_by(new.key.agent(), new.key.user())
            })
        {
            return (Submitted::earlier(r.clone()), None);
        }
        let mut run = Run::new(new, now);
        run.seq = runs.iter().map(|r| r.seq).max().unwrap_or(0) + 1;
        runs.push(run.clone());
        (Submitted::stored(run), Some(runs.len() - 1))
    }

    /// [`submit`], then, when the new run's session has no other queued or running run, a
    /// claim of it.
    pub(crate) fn submit_claimed(
        runs: &mut Vec<Run>,
        new: &NewRun,
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> (Submitted, Option<Claim>, Option<usize>) {
        let (submitted, changed) = submit(runs, new, now);
        let Some(i) = changed else {
            return (submitted, None, None);
        };
        let mut submitted = submitted;
        let claim = claim_new(runs, i, options, now);
        if let Some(c) = &claim {
            submitted.run = c.run.clone();
        }
        (submitted, claim, Some(i))
    }

    /// Claims the new run `i` when no other run of its session holds it (queued, running
    /// or waiting for a decision).
    pub(crate) fn claim_new(
        runs: &mut [Run],
        i: usize,
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> Option<Claim> {
        let r = &runs[i];
        let busy = runs.iter().any(|o| {
            o.id != r.id
                && o.status.holds_session()
                && o.agent == r.agent
                && o.user == r.user
                && o.session == r.session
        });
        (!busy).then(|| take(runs, i, options, now))
    }

    pub(crate) fn claim(
        runs: &mut [Run],
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> (Option<Claim>, Option<usize>) {
        let Some(i) = super::super::pick(runs, &options.agent, now) else {
            return (None, None);
        };
        (Some(take(runs, i, options, now)), Some(i))
    }

    /// Claims run `i` (a new token, one more attempt).
    pub(crate) fn take(
        runs: &mut [Run],
        i: usize,
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> Claim {
        let r = &mut runs[i];
        r.status = RunStatus::Running;
        r.attempts += 1;
        r.token = new_token();
        r.worker = Some(options.worker.clone());
        r.expires = Some(now + lapse_delta(options.lapse));
        r.updated = now;
        Claim::of(r.clone(), r.token.clone(), options)
    }

    fn held<'a>(runs: &'a mut [Run], claim: &Claim) -> Result<(usize, &'a mut Run)> {
        runs.iter_mut()
            .enumerate()
            .find(|(_, r)| r.id == claim.run.id)
            .filter(|(_, r)| r.status == RunStatus::Running && r.token == claim.token)
            .ok_or_else(|| claim_lost(&claim.run.id))
    }

    pub(crate) fn heartbeat(
        runs: &mut [Run],
        claim: &Claim,
        now: DateTime<Utc>,
    ) -> Result<(Beat, Option<usize>)> {
        let (i, r) = held(runs, claim)?;
        r.expires = Some(now + lapse_delta(claim.lapse));
        let beat = Beat {
            cancel_requested: r.cancel_requested,
        };
        Ok((beat, Some(i)))
    }

    pub(crate) fn finish(
        runs: &mut [Run],
        claim: &Claim,
        end: &RunEnd,
        now: DateTime<Utc>,
    ) -> Result<(Run, Option<usize>)> {
        let (i, r) = held(runs, claim)?;
        end.apply(r);
        r.expires = None;
        r.token.clear();
        r.updated = now;
        Ok((r.clone(), Some(i)))
    }

    pub(crate) fn cancel(
        runs: &mut [Run],
        id: &str,
        now: DateTime<Utc>,
    ) -> (CancelOutcome, Option<usize>) {
        let Some((i, r)) = runs.iter_mut().enumerate().find(|(_, r)| r.id == id) else {
            return (CancelOutcome::NotFound, None);
        };
        match r.status {
            RunStatus::Queued | RunStatus::WaitingApproval => {
                RunEnd::Cancelled.apply(r);
                r.updated = now;
                (CancelOutcome::Cancelled(r.clone()), Some(i))
            }
            RunStatus::Running => {
                let changed = !r.cancel_requested;
                r.cancel_requested = true;
                r.updated = now;
                (CancelOutcome::Requested(r.clone()), changed.then_some(i))
            }
            _ => (CancelOutcome::Finished(r.clone()), None),
        }
    }

    /// Records `decision` on the waiting run of session `key` and claims it (see
    /// [`RunQueue::decide`]).
    pub(crate) fn decide(
        runs: &mut [Run],
        key: &StateKey,
        decision: &Decision,
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> (Decided, Option<usize>) {
        let head = runs
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.status.holds_session()
                    && r.agent == key.agent()
                    && r.user.as_deref() == key.user()
                    && r.session == key.session()
            })
            .min_by_key(|(_, r)| r.seq)
            .map(|(i, _)| i);
        let (i, approvals) = match super::super::decide_on(head.map(|i| runs[i].clone()), decision)
        {
            Ok((run, approvals)) => match runs.iter().position(|r| r.id == run.id) {
                Some(i) => (i, approvals),
                None => return (Decided::NoneWaiting, None),
            },
            Err(answer) => return (*answer, None),
        };
        runs[i].approvals = Some(approvals);
        runs[i].cancel_requested = false;
        (Decided::Claimed(take(runs, i, options, now)), Some(i))
    }

    /// The indexes of the finished runs of `agent` changed before `before`, oldest first,
    /// at most `limit`.
    pub(crate) fn purgeable(
        runs: &[Run],
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Vec<usize> {
        let mut old: Vec<usize> = (0..runs.len())
            .filter(|&i| {
                let r = &runs[i];
                r.agent == agent && r.status.is_purgeable() && r.updated < before
            })
            .collect();
        old.sort_by_key(|&i| (runs[i].updated, runs[i].seq));
        old.truncate(limit);
        old
    }

    pub(crate) fn list(runs: &[Run], filter: RunFilter<'_>) -> Vec<Run> {
        let RunFilter {
            agent,
            user,
            session,
            limit,
        } = filter;
        let mut out: Vec<Run> = runs
            .iter()
            .filter(|r| r.is_owned_by(agent, user) && session.is_none_or(|s| r.session == s))
            .cloned()
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.seq));
        out.truncate(limit);
        out
    }
}

/// A run queue in this process's memory (`memory://`): for tests and single-process use.
#[derive(Debug, Default, Clone)]
pub struct InMemoryRunQueue {
    runs: Arc<Mutex<Vec<Run>>>,
    wake: Arc<tokio::sync::Notify>,
}

impl InMemoryRunQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Vec<Run>) -> T) -> T {
        let mut runs = self
            .runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut runs)
    }
}

#[async_trait]
impl RunQueue for InMemoryRunQueue {
    async fn submit(&self, new: NewRun) -> Result<Submitted> {
        let out = self.with(|runs| ops::submit(runs, &new, Utc::now()).0);
        self.wake.notify_waiters();
        Ok(out)
    }

    async fn submit_claimed(
        &self,
        new: NewRun,
        options: &ClaimOptions,
    ) -> Result<(Submitted, Option<Claim>)> {
        let (submitted, claim, _) =
            self.with(|runs| ops::submit_claimed(runs, &new, options, Utc::now()));
        if claim.is_none() {
            self.wake.notify_waiters();
        }
        Ok((submitted, claim))
    }

    async fn get(&self, id: &str) -> Result<Option<Run>> {
        if validate_run_id(id).is_err() {
            return Ok(None);
        }
        Ok(self.with(|runs| runs.iter().find(|r| r.id == id).cloned()))
    }

    async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
        Ok(self.with(|runs| ops::list(runs, filter)))
    }

    async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
        Ok(self.with(|runs| ops::claim(runs, options, Utc::now()).0))
    }

    async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
        self.with(|runs| ops::heartbeat(runs, claim, Utc::now()).map(|(b, _)| b))
    }

    async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
        let out = self.with(|runs| ops::finish(runs, claim, end, Utc::now()).map(|(r, _)| r));
        self.wake.notify_waiters();
        out
    }

    async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
        let out = self.with(|runs| ops::cancel(runs, id, Utc::now()).0);
        self.wake.notify_waiters();
        Ok(out)
    }

    async fn decide(
        &self,
        key: &StateKey,
        decision: &Decision,
        options: &ClaimOptions,
    ) -> Result<Decided> {
        Ok(self.with(|runs| ops::decide(runs, key, decision, options, Utc::now()).0))
    }

    async fn purge_finished(
        &self,
        agent: &str,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<usize> {
        Ok(self.with(|runs| {
            let gone: std::collections::HashSet<String> =
                ops::purgeable(runs, agent, before, limit)
                    .into_iter()
                    .map(|i| runs[i].id.clone())
                    .collect();
            runs.retain(|r| !gone.contains(&r.id));
            gone.len()
        }))
    }

    async fn wait_for_work(&self, max: Duration) -> Result<()> {
        let _ = tokio::time::timeout(max, self.wake.notified()).await;
        Ok(())
    }

    fn is_shared(&self) -> bool {
        false
    }
}

#[cfg(feature = "json")]
pub use json::JsonRunQueue;

#[cfg(feature = "json")]
mod json {
    use std::fs::{self, File, OpenOptions};
    use std::io::Write;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::error::Error;

    /// A run queue for the processes of one machine, under `<root>/.runs/` (`.runs` is
    /// never an agent id):
    ///
    /// ```text
    /// .runs/queue.lock          every change is made under an exclusive OS lock of it
    /// .runs/seq                 the last submission number
    /// .runs/active/<id>.json    queued, running and waiting_approval runs
    /// .runs/done/<id>.json      ended runs
    /// .runs/idem/<hash>         "<agent>\t<user>\t<key>\t<run id>" lines: idempotency keys
    /// ```
    ///
    /// Every file is written with a temp file, `fsync` and rename (and the directory
    /// `fsync`ed), so a crash leaves the old or the new record. A claim reads the active
    /// runs only; a heartbeat, finish or cancel reads its own run. Wall-clock time (one
    /// host, one clock) decides when a claim lapses.
    #[derive(Debug, Clone)]
    pub struct JsonRunQueue {
        dir: PathBuf,
    }

    /// FNV-1a over the parts, as 16 hex digits: the idempotency index file of a key.
    fn idem_file(agent: &str, user: Option<&str>, key: &str) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for part in [agent, user.unwrap_or(""), key] {
            for b in part.bytes().chain([0]) {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{hash:016x}")
    }

    fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_data()?;
            fs::rename(&tmp, &path)?;
            File::open(dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            Error::io(&path, e)
        })
    }

    fn read_run(path: &Path) -> Result<Option<Run>> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::io(path, std::io::Error::other(e))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    impl JsonRunQueue {
        /// The queue of the JSON store rooted at `root` (created if missing).
        pub fn open(root: impl AsRef<Path>) -> Result<Self> {
            let dir = root.as_ref().join(".runs");
            for sub in ["active", "done", "idem"] {
                let d = dir.join(sub);
                fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
            }
            Ok(Self { dir })
        }

        fn active(&self) -> PathBuf {
            self.dir.join("active")
        }

        fn done(&self) -> PathBuf {
            self.dir.join("done")
        }

        /// A run by id: its finished record first (a crash between writing it and
        /// removing the active one leaves both).
        fn read(&self, id: &str) -> Result<Option<Run>> {
            let name = format!("{id}.json");
            match read_run(&self.done().join(&name))? {
                Some(run) => Ok(Some(run)),
                None => read_run(&self.active().join(&name)),
            }
        }

        /// Every run of one of the directories.
        fn read_dir(&self, dir: &Path) -> Result<Vec<Run>> {
            let mut runs = Vec::new();
            let entries = fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(dir, e))?;
                let name = entry.file_name();
                let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                    continue;
                };
                if validate_run_id(id).is_err() {
                    continue;
                }
                if let Some(run) = read_run(&entry.path())? {
                    runs.push(run);
                }
            }
            Ok(runs)
        }

        /// Writes a run where its status puts it (an ended run moves to `done/`; one
        /// waiting for a decision stays active: it holds its session).
        fn write(&self, run: &Run) -> Result<()> {
            let bytes = serde_json::to_vec(run).map_err(Error::Serialize)?;
            let name = format!("{}.json", run.id);
            if !run.status.holds_session() {
                write_atomic(&self.done(), &name, &bytes)?;
                let active = self.active().join(&name);
                match fs::remove_file(&active) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(Error::io(&active, e)),
                }
            } else {
                write_atomic(&self.active(), &name, &bytes)
            }
        }

        /// Runs `f` under the queue's lock.
        async fn locked<T: Send + 'static>(
            &self,
            f: impl FnOnce(&Self, DateTime<Utc>) -> Result<T> + Send + 'static,
        ) -> Result<T> {
            let me = self.clone();
            tokio::task::spawn_blocking(move || {
                let lock_path = me.dir.join("queue.lock");
                let lock = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&lock_path)
                    .map_err(|e| Error::io(&lock_path, e))?;
                lock.lock().map_err(|e| Error::io(&lock_path, e))?;
                let out = f(&me, Utc::now());
                drop(lock);
                out
            })
            .await
            .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))?
        }

        /// Applies `op` to the active run `id` under the lock and writes what it changed;
        /// `missing` answers when there is no such active run.
        async fn on_run<T: Send + 'static>(
            &self,
            id: String,
            op: impl FnOnce(&mut [Run], DateTime<Utc>) -> Result<(T, Option<usize>)> + Send + 'static,
            missing: impl FnOnce(Option<Run>) -> Result<T> + Send + 'static,
        ) -> Result<T> {
            self.locked(move |me, now| {
                let name = format!("{id}.json");
                let finished = read_run(&me.done().join(&name))?;
                let active = match finished {
                    Some(_) => None,
                    None => read_run(&me.active().join(&name))?,
                };
                let Some(run) = active else {
                    return missing(finished);
                };
                let mut one = [run];
                let (out, changed) = op(&mut one, now)?;
                if changed.is_some() {
                    me.write(&one[0])?;
                }
                Ok(out)
            })
            .await
        }

        /// Stores a new run (the queue lock held).
        fn submit_locked(&self, new: &NewRun, now: DateTime<Utc>) -> Result<Submitted> {
            let me = self;
            let (agent, user) = (new.key.agent(), new.key.user());
            let idem = new
                .idempotency_key
                .as_deref()
                .map(|k| (me.dir.join("idem"), idem_file(agent, user, k), k));
            let mut index = String::new();
            if let Some((dir, file, key)) = &idem {
                match fs::read_to_string(dir.join(file)) {
                    Ok(text) => index = text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(dir.join(file), e)),
                }
                let user = user.unwrap_or("");
                let hit = index.lines().find_map(|l| {
                    let mut f = l.split('\t');
                    let ok =
                        f.next() == Some(agent) && f.next() == Some(user) && f.next() == Some(*key);
                    ok.then(|| f.next()).flatten()
                });
                if let Some(run) = hit.map(|id| me.read(id)).transpose()?.flatten() {
                    return Ok(Submitted::earlier(run));
                }
            }
            let seq_path = me.dir.join("seq");
            let last = match fs::read_to_string(&seq_path) {
                Ok(t) => t.trim().parse::<u64>().unwrap_or(0),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => return Err(Error::io(&seq_path, e)),
            };
            let mut run = Run::new(new, now);
            run.seq = last + 1;
            write_atomic(&me.dir, "seq", run.seq.to_string().as_bytes())?;
            me.write(&run)?;
            if let Some((dir, file, key)) = &idem {
                index.push_str(&format!(
                    "{agent}\t{}\t{key}\t{}\n",
                    user.unwrap_or(""),
                    run.id
                ));
                write_atomic(dir, file, index.as_bytes())?;
            }
            Ok(Submitted::stored(run))
        }

        /// The active (queued, running or waiting) runs (the queue lock held). A crash between
        /// writing a finished run to `done/` and removing its active record leaves both:
        /// the finished one counts.
        fn active_runs(&self) -> Result<Vec<Run>> {
            let mut runs = self.read_dir(&self.active())?;
            runs.retain(|r| {
                let name = format!("{}.json", r.id);
                let finished = self.done().join(&name).exists();
                if finished {
                    let _ = fs::remove_file(self.active().join(&name));
                }
                !finished
            });
            Ok(runs)
        }
    }

    #[async_trait]
    impl RunQueue for JsonRunQueue {
        async fn submit(&self, new: NewRun) -> Result<Submitted> {
            self.locked(move |me, now| me.submit_locked(&new, now))
                .await
        }

        async fn submit_claimed(
            &self,
            new: NewRun,
            options: &ClaimOptions,
        ) -> Result<(Submitted, Option<Claim>)> {
            let options = options.clone();
            self.locked(move |me, now| {
                let submitted = me.submit_locked(&new, now)?;
                if !submitted.created {
                    return Ok((submitted, None));
                }
                let mut runs = me.active_runs()?;
                let Some(i) = runs.iter().position(|r| r.id == submitted.run.id) else {
                    return Ok((submitted, None));
                };
                let mut submitted = submitted;
                let claim = ops::claim_new(&mut runs, i, &options, now);
                if let Some(c) = &claim {
                    me.write(&runs[i])?;
                    submitted.run = c.run.clone();
                }
                Ok((submitted, claim))
            })
            .await
        }

        async fn get(&self, id: &str) -> Result<Option<Run>> {
            if validate_run_id(id).is_err() {
                return Ok(None);
            }
            let (me, id) = (self.clone(), id.to_owned());
            tokio::task::spawn_blocking(move || me.read(&id))
                .await
                .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))?
        }

        async fn list(&self, filter: RunFilter<'_>) -> Result<Vec<Run>> {
            let me = self.clone();
            let runs = tokio::task::spawn_blocking(move || {
                let mut runs = me.read_dir(&me.done())?;
                let seen: std::collections::HashSet<String> =
                    runs.iter().map(|r| r.id.clone()).collect();
                runs.extend(
                    me.read_dir(&me.active())?
                        .into_iter()
                        .filter(|r| !seen.contains(&r.id)),
                );
                Ok::<_, Error>(runs)
            })
            .await
            .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))??;
            Ok(ops::list(&runs, filter))
        }

        async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
            let options = options.clone();
            self.locked(move |me, now| {
                let mut runs = me.active_runs()?;
                let (claim, changed) = ops::claim(&mut runs, &options, now);
                if let Some(i) = changed {
                    me.write(&runs[i])?;
                }
                Ok(claim)
            })
            .await
        }

        async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
            let c = claim.clone();
            let id = claim.run.id.clone();
            self.on_run(
                claim.run.id.clone(),
                move |runs, now| ops::heartbeat(runs, &c, now),
                move |_| Err(claim_lost(&id)),
            )
            .await
        }

        async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
            let (c, end) = (claim.clone(), end.clone());
            let id = claim.run.id.clone();
            self.on_run(
                claim.run.id.clone(),
                move |runs, now| ops::finish(runs, &c, &end, now),
                move |_| Err(claim_lost(&id)),
            )
            .await
        }

        async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
            if validate_run_id(id).is_err() {
                return Ok(CancelOutcome::NotFound);
            }
            let id2 = id.to_owned();
            self.on_run(
                id.to_owned(),
                move |runs, now| Ok(ops::cancel(runs, &id2, now)),
                |finished| Ok(finished.map_or(CancelOutcome::NotFound, CancelOutcome::Finished)),
            )
            .await
        }

        async fn decide(
            &self,
            key: &StateKey,
            decision: &Decision,
            options: &ClaimOptions,
        ) -> Result<Decided> {
            let (key, decision, options) = (key.clone(), decision.clone(), options.clone());
            self.locked(move |me, now| {
                let mut runs = me.active_runs()?;
                let (out, changed) = ops::decide(&mut runs, &key, &decision, &options, now);
                if let Some(i) = changed {
                    me.write(&runs[i])?;
                }
                Ok(out)
            })
            .await
        }

        async fn purge_finished(
            &self,
            agent: &str,
            before: DateTime<Utc>,
            limit: usize,
        ) -> Result<usize> {
            let agent = agent.to_owned();
            self.locked(move |me, _| {
                let runs = me.read_dir(&me.done())?;
                let mut n = 0;
                for i in ops::purgeable(&runs, &agent, before, limit) {
                    let run = &runs[i];
                    // The idempotency key first: a crash after it leaves a finished run
                    // without its key, never a key naming no run.
                    if let Some(key) = &run.idempotency_key {
                        let dir = me.dir.join("idem");
                        let file = idem_file(&run.agent, run.user.as_deref(), key);
                        match fs::read_to_string(dir.join(&file)) {
                            Ok(text) => {
                                let kept: String = text
                                    .lines()
                                    .filter(|l| l.rsplit('\t').next() != Some(run.id.as_str()))
                                    .map(|l| format!("{l}\n"))
                                    .collect();
                                if kept.is_empty() {
                                    let path = dir.join(&file);
                                    fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                                } else {
                                    write_atomic(&dir, &file, kept.as_bytes())?;
                                }
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(Error::io(dir.join(&file), e)),
                        }
                    }
                    let path = me.done().join(format!("{}.json", run.id));
                    match fs::remove_file(&path) {
                        Ok(()) => n += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(Error::io(&path, e)),
                    }
                }
                Ok(n)
            })
            .await
        }

        async fn wait_for_work(&self, max: Duration) -> Result<()> {
            tokio::time::sleep(max.min(LOCAL_POLL)).await;
            Ok(())
        }

        fn is_shared(&self) -> bool {
            false
        }
    }
}
