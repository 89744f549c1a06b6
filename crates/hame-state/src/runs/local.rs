//! The single-machine queues: [`InMemoryRunQueue`] (one process) and `JsonRunQueue` (the
//! processes of one host, one file per run under an OS lock). Both apply the same
//! operations ([`ops`]) to the list of runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use super::{
    Beat, CancelOutcome, Claim, ClaimOptions, NewRun, Run, RunEnd, RunQueue, RunStatus, Submitted,
    claim_lost, validate_run_id,
};
use crate::error::Result;

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
            let run = r.clone();
            return (
                Submitted {
                    run,
                    created: false,
                },
                None,
            );
        }
        let mut run = Run::new(new, now);
        run.seq = runs.iter().map(|r| r.seq).max().unwrap_or(0) + 1;
        runs.push(run.clone());
        (Submitted { run, created: true }, Some(runs.len() - 1))
    }

    pub(crate) fn claim(
        runs: &mut [Run],
        options: &ClaimOptions,
        now: DateTime<Utc>,
    ) -> (Option<Claim>, Option<usize>) {
        let Some(i) = super::super::pick(runs, &options.agent, now) else {
            return (None, None);
        };
        let r = &mut runs[i];
        r.status = RunStatus::Running;
        r.attempts += 1;
        r.token = uuid::Uuid::new_v4().simple().to_string();
        r.worker = Some(options.worker.clone());
        r.expires = Some(now + lapse_delta(options.lapse));
        r.updated = now;
        let claim = Claim {
            run: r.clone(),
            token: r.token.clone(),
            attempt: r.attempts,
            lapse: options.lapse,
        };
        (Some(claim), Some(i))
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
            RunStatus::Queued => {
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

    pub(crate) fn list(
        runs: &[Run],
        agent: &str,
        user: Option<&str>,
        session: Option<&str>,
        limit: usize,
    ) -> Vec<Run> {
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

    async fn get(&self, id: &str) -> Result<Option<Run>> {
        if validate_run_id(id).is_err() {
            return Ok(None);
        }
        Ok(self.with(|runs| runs.iter().find(|r| r.id == id).cloned()))
    }

    async fn list(
        &self,
        agent: &str,
        user: Option<&str>,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Run>> {
        Ok(self.with(|runs| ops::list(runs, agent, user, session, limit)))
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
        Ok(self.with(|runs| ops::cancel(runs, id, Utc::now()).0))
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

    /// A run queue for the processes of one machine: one JSON file per run under
    /// `<root>/.runs/` (`.runs` is never an agent id), every change made under an exclusive
    /// OS lock of `<root>/.runs/queue.lock` and written with a temp file, `fsync` and
    /// rename, so a crash leaves the old or the new record. Wall-clock time (one host, one
    /// clock) decides when a claim lapses.
    ///
    /// Every claim reads every run record: fine for thousands of runs; beyond, use
    /// PostgreSQL.
    #[derive(Debug, Clone)]
    pub struct JsonRunQueue {
        dir: PathBuf,
    }

    impl JsonRunQueue {
        /// The queue of the JSON store rooted at `root` (created if missing).
        pub fn open(root: impl AsRef<Path>) -> Result<Self> {
            let dir = root.as_ref().join(".runs");
            fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
            Ok(Self { dir })
        }

        fn path(&self, id: &str) -> PathBuf {
            self.dir.join(format!("{id}.json"))
        }

        fn read(&self, path: &Path) -> Result<Option<Run>> {
            match fs::read(path) {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| Error::io(path, std::io::Error::other(e))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io(path, e)),
            }
        }

        fn read_all(&self) -> Result<Vec<Run>> {
            let mut runs = Vec::new();
            let entries = fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
                let name = entry.file_name();
                let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                    continue;
                };
                if validate_run_id(id).is_err() {
                    continue;
                }
                if let Some(run) = self.read(&entry.path())? {
                    runs.push(run);
                }
            }
            Ok(runs)
        }

        fn write(&self, run: &Run) -> Result<()> {
            let path = self.path(&run.id);
            let tmp = self
                .dir
                .join(format!(".{}.{}.tmp", run.id, uuid::Uuid::new_v4().simple()));
            let bytes = serde_json::to_vec(run).map_err(Error::Serialize)?;
            let write = || -> std::io::Result<()> {
                let mut f = File::create(&tmp)?;
                f.write_all(&bytes)?;
                f.sync_data()?;
                fs::rename(&tmp, &path)?;
                File::open(&self.dir)?.sync_all()
            };
            write().map_err(|e| {
                let _ = fs::remove_file(&tmp);
                Error::io(&path, e)
            })
        }

        /// Runs `f` over every run under the queue's lock and writes the run it changed.
        async fn transact<T: Send + 'static>(
            &self,
            f: impl FnOnce(&mut Vec<Run>, DateTime<Utc>) -> Result<(T, Option<usize>)> + Send + 'static,
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
                let mut runs = me.read_all()?;
                let (out, changed) = f(&mut runs, Utc::now())?;
                if let Some(i) = changed {
                    me.write(&runs[i])?;
                }
                drop(lock);
                Ok(out)
            })
            .await
            .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))?
        }
    }

    #[async_trait]
    impl RunQueue for JsonRunQueue {
        async fn submit(&self, new: NewRun) -> Result<Submitted> {
            self.transact(move |runs, now| Ok(ops::submit(runs, &new, now)))
                .await
        }

        async fn get(&self, id: &str) -> Result<Option<Run>> {
            if validate_run_id(id).is_err() {
                return Ok(None);
            }
            let me = self.clone();
            let path = self.path(id);
            tokio::task::spawn_blocking(move || me.read(&path))
                .await
                .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))?
        }

        async fn list(
            &self,
            agent: &str,
            user: Option<&str>,
            session: Option<&str>,
            limit: usize,
        ) -> Result<Vec<Run>> {
            let me = self.clone();
            let runs = tokio::task::spawn_blocking(move || me.read_all())
                .await
                .map_err(|e| Error::io(&self.dir, std::io::Error::other(e)))??;
            Ok(ops::list(&runs, agent, user, session, limit))
        }

        async fn claim(&self, options: &ClaimOptions) -> Result<Option<Claim>> {
            let options = options.clone();
            self.transact(move |runs, now| Ok(ops::claim(runs, &options, now)))
                .await
        }

        async fn heartbeat(&self, claim: &Claim) -> Result<Beat> {
            let claim = claim.clone();
            self.transact(move |runs, now| ops::heartbeat(runs, &claim, now))
                .await
        }

        async fn finish(&self, claim: &Claim, end: &RunEnd) -> Result<Run> {
            let (claim, end) = (claim.clone(), end.clone());
            self.transact(move |runs, now| ops::finish(runs, &claim, &end, now))
                .await
        }

        async fn cancel(&self, id: &str) -> Result<CancelOutcome> {
            if validate_run_id(id).is_err() {
                return Ok(CancelOutcome::NotFound);
            }
            let id = id.to_owned();
            self.transact(move |runs, now| Ok(ops::cancel(runs, &id, now)))
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
