use pretty_assertions::assert_eq;
use proptest::prelude::*;

use super::*;

#[test]
fn one_key_per_agent_user_and_session_naming_none() -> Result<(), hame_state::Error> {
    let a = prompt_cache_key(&StateKey::new("agent", Some("alice"), "s1")?);
    assert_eq!(
        a,
        prompt_cache_key(&StateKey::new("agent", Some("alice"), "s1")?)
    );
    assert_eq!(a.0.len(), "hame-".len() + 16);
    assert!(!a.0.contains("alice") && !a.0.contains("s1"));
    for other in [
        StateKey::new("agent", Some("bob"), "s1")?,
        StateKey::new("agent", None::<&str>, "s1")?,
        StateKey::new("agent", Some("alice"), "s2")?,
        StateKey::new("other", Some("alice"), "s1")?,
    ] {
        assert_ne!(a, prompt_cache_key(&other));
    }
    Ok(())
}

#[test]
fn a_request_costs_each_kind_of_token_at_its_rate() {
    let p = Price::new(3.0, 15.0, 0.3, 3.75);
    let u = Usage {
        input_tokens: 1_000_000 + 2_000_000 + 100_000,
        output_tokens: 10_000,
        cached_input_tokens: 2_000_000,
        cache_write_input_tokens: 100_000,
    };
    let expected = 3.0 + 2.0 * 0.3 + 0.1 * 3.75 + 0.01 * 15.0;
    assert!((p.cost(&u) - expected).abs() < 1e-9, "{}", p.cost(&u));
    // Without cache rates, cached tokens cost the input rate.
    let plain = Price {
        cached_input: None,
        cache_write: None,
        ..p
    };
    assert!((plain.cost(&u) - (3.1 * 3.0 + 0.15)).abs() < 1e-9);
    // Figures that do not add up never underflow.
    let odd = Usage {
        input_tokens: 5,
        cached_input_tokens: 10,
        ..Usage::default()
    };
    assert!(p.cost(&odd) >= 0.0);
    assert!(!Price::new(f64::NAN, 1.0, 1.0, 1.0).is_valid());
    assert!(!Price::new(1.0, -1.0, 1.0, 1.0).is_valid());
    assert!(DEFAULT_PRICES.iter().all(|(_, p)| p.is_valid()));
}

#[test]
fn the_longest_prefix_prices_a_model() {
    let prices = Prices::default();
    let get = |provider: &str, model: &str| prices.get(provider, model).map(|p| p.input);
    assert_eq!(get("openai", "gpt-4o-mini-2024-07-18"), Some(0.15));
    assert_eq!(get("openai", "gpt-4o-2024-08-06"), Some(2.5));
    assert_eq!(get("anthropic", "claude-sonnet-4-5-20250929"), Some(3.0));
    assert_eq!(get("anthropic", "claude-opus-4-5"), Some(5.0));
    assert_eq!(get("anthropic", "claude-opus-4-1"), Some(15.0));
    assert_eq!(get("ollama", "llama3.1:8b"), Some(0.0));
    assert_eq!(get("openai", "my-finetune"), None);
    let custom = Prices::default()
        .with("openai:my-", Price::new(1.0, 2.0, 0.5, 1.0))
        .with("gpt-4o", Price::new(9.0, 9.0, 9.0, 9.0));
    assert_eq!(
        custom.get("openai", "my-finetune").map(|p| p.input),
        Some(1.0)
    );
    assert_eq!(custom.get("openai", "gpt-4o").map(|p| p.input), Some(9.0));
    assert_eq!(Prices::empty().get("openai", "gpt-4o"), None);
}

#[test]
fn budget_flags_parse_or_say_what_is_accepted() {
    let mut b = Budgets::default();
    assert!(b.is_unlimited());
    for ok in [
        "0.5",
        "session.tokens=200_000",
        "user_day.usd = 20",
        "run.output_tokens=0",
        "session.input_tokens=7",
    ] {
        assert_eq!(b.set(ok), Ok(()), "{ok}");
    }
    assert_eq!(
        b,
        Budgets {
            run: Limit {
                usd: Some(0.5),
                output_tokens: Some(0),
                ..Limit::default()
            },
            session: Limit {
                tokens: Some(200_000),
                input_tokens: Some(7),
                ..Limit::default()
            },
            user_day: Limit {
                usd: Some(20.0),
                ..Limit::default()
            },
        }
    );
    for bad in [
        "",
        "run",
        "run.usd",
        "run.usd=-1",
        "run.usd=NaN",
        "run.usd=inf",
        "week.usd=1",
        "run.euros=1",
        "run.tokens=1.5",
        "run.tokens=-3",
        "session.tokens=99999999999999999999999",
        "../run.usd=1",
    ] {
        let e = Budgets::default().set(bad);
        assert!(e.is_err(), "{bad:?} was accepted");
    }
    let e = Budgets::default()
        .set("week.usd=1")
        .err()
        .unwrap_or_default();
    assert!(
        e.contains("run, session, user_day") && e.contains("run.usd=0.50"),
        "{e}"
    );
    let base = Budgets {
        run: Limit {
            usd: Some(1.0),
            tokens: Some(10),
            ..Limit::default()
        },
        ..Budgets::default()
    };
    let mut flags = Budgets::default();
    assert_eq!(flags.set("run.usd=2"), Ok(()));
    let merged = base.overlay(&flags);
    assert_eq!(merged.run.usd, Some(2.0));
    assert_eq!(merged.run.tokens, Some(10));
}

fn spend(input: u64, output: u64, usd: f64) -> Spend {
    Spend {
        requests: 1,
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            ..Usage::default()
        },
        usd,
        unpriced: 0,
    }
}

#[test]
fn the_first_scope_over_its_limit_is_named_with_what_it_spent() {
    let budgets = Budgets {
        run: Limit {
            tokens: Some(1_000),
            ..Limit::default()
        },
        session: Limit {
            usd: Some(0.10),
            ..Limit::default()
        },
        user_day: Limit {
            output_tokens: Some(50),
            ..Limit::default()
        },
    };
    let none = Spend::default();
    assert_eq!(check(&budgets, &none, &none, &none), None);
    let over = check(&budgets, &spend(990, 10, 0.0), &none, &none);
    assert_eq!(
        over,
        Some(BudgetExceeded {
            scope: "run".into(),
            limit: "tokens".into(),
            max: 1_000.0,
            spent: 1_000.0,
            usage: spend(990, 10, 0.0).usage,
            usd: 0.0,
        })
    );
    let over = check(&budgets, &none, &spend(10, 1, 0.25), &none);
    assert_eq!(over.as_ref().map(|o| o.scope.as_str()), Some("session"));
    let text = over.map(|o| o.to_string()).unwrap_or_default();
    assert!(
        text.contains("session usd spent $0.2500 of $0.1000")
            && text.contains("--budget session.usd=N")
            && !text.contains('\n'),
        "{text}"
    );
    let over = check(&budgets, &none, &none, &spend(0, 60, 0.0));
    assert_eq!(over.map(|o| o.limit), Some("output_tokens".to_owned()));
    let zero = Budgets {
        run: Limit {
            usd: Some(0.0),
            ..Limit::default()
        },
        ..Budgets::default()
    };
    assert!(check(&zero, &none, &none, &none).is_some());
}

proptest! {
    /// A request is refused exactly when some scope has spent at least one of its limits.
    #[test]
    fn refused_exactly_when_a_limit_is_reached(
        limits in proptest::collection::vec(proptest::option::of(0u64..2_000), 12),
        spent in proptest::collection::vec((0u64..2_000, 0u64..2_000, 0u64..2_000), 3),
    ) {
        let limit = |i: usize| Limit {
            usd: limits[i * 4].map(|v| v as f64 / 1_000.0),
            tokens: limits[i * 4 + 1],
            input_tokens: limits[i * 4 + 2],
            output_tokens: limits[i * 4 + 3],
        };
        let budgets = Budgets { run: limit(0), session: limit(1), user_day: limit(2) };
        let s: Vec<Spend> = spent
            .iter()
            .map(|(i, o, m)| spend(*i, *o, *m as f64 / 1_000.0))
            .collect();
        let reached = |l: &Limit, s: &Spend| {
            l.usd.is_some_and(|m| s.usd >= m)
                || l.tokens.is_some_and(|m| s.usage.total() >= m)
                || l.input_tokens.is_some_and(|m| s.usage.input_tokens >= m)
                || l.output_tokens.is_some_and(|m| s.usage.output_tokens >= m)
        };
        let expected = reached(&budgets.run, &s[0])
            || reached(&budgets.session, &s[1])
            || reached(&budgets.user_day, &s[2]);
        prop_assert_eq!(check(&budgets, &s[0], &s[1], &s[2]).is_some(), expected);
    }
}

#[test]
fn the_spend_record_lives_in_the_state_by_day_and_model() -> Result<(), serde_json::Error> {
    let mut state = AgentState::default();
    assert_eq!(SpendRecord::of(&state), SpendRecord::default());
    let mut r = SpendRecord::default();
    r.add("2026-12-03", "openai:gpt-4o", &spend(100, 10, 0.5));
    r.add("2026-12-04", "openai:gpt-4o", &spend(100, 10, 0.25));
    r.add(
        "2026-12-04",
        "anthropic:claude-sonnet-4-5",
        &spend(1, 1, 0.25),
    );
    r.store(&mut state);
    let back = AgentState::from_json(serde_json::to_value(&state)?)
        .map_err(|e| serde_json::Error::io(std::io::Error::other(e.to_string())))?;
    let r = SpendRecord::of(&back);
    assert_eq!(r.day("2026-12-04").usd, 0.5);
    assert_eq!(r.day("2026-12-04").requests, 2);
    assert_eq!(r.total().usd, 1.0);
    assert_eq!(r.total().usage.input_tokens, 201);
    assert_eq!(r.day("2026-12-05"), Spend::default());
    // A record that cannot be read counts as empty rather than failing the call.
    state
        .extensions
        .insert(SPEND_EXTENSION.into(), serde_json::json!("garbage"));
    assert_eq!(SpendRecord::of(&state), SpendRecord::default());
    Ok(())
}

#[test]
fn a_callers_budget_only_tightens_the_agents() {
    let agent = Budgets {
        run: Limit {
            usd: Some(1.0),
            tokens: Some(1_000),
            ..Limit::default()
        },
        ..Budgets::default()
    };
    let caller = Budgets {
        run: Limit {
            usd: Some(5.0),
            tokens: Some(10),
            ..Limit::default()
        },
        user_day: Limit {
            output_tokens: Some(7),
            ..Limit::default()
        },
        ..Budgets::default()
    };
    let call = agent.tighten(&caller);
    assert_eq!(call.run.usd, Some(1.0), "a caller cannot raise a limit");
    assert_eq!(call.run.tokens, Some(10));
    assert_eq!(call.user_day.output_tokens, Some(7));
    let mut extras = std::collections::BTreeMap::new();
    assert_eq!(agent.for_call(&extras), Ok(agent));
    extras.insert(
        BUDGET_EXTRA.to_owned(),
        serde_json::to_value(caller).unwrap_or_default(),
    );
    assert_eq!(agent.for_call(&extras), Ok(call));
    for bad in [
        serde_json::json!({"week": {"usd": 1}}),
        serde_json::json!({"run": {"tokens": -1}}),
        serde_json::json!({"run": {"usd": -0.5}}),
        serde_json::json!("run.usd=1"),
    ] {
        extras.insert(BUDGET_EXTRA.to_owned(), bad.clone());
        assert!(agent.for_call(&extras).is_err(), "{bad} was accepted");
    }
}

/// A store that counts its loads.
#[derive(Debug, Default)]
struct CountingLoads {
    inner: hame_state::InMemoryStore,
    loads: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl StateStore for CountingLoads {
    async fn load(&self, key: &StateKey) -> hame_state::Result<Option<hame_state::Stored>> {
        self.loads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.load(key).await
    }
    async fn put(&self, key: &StateKey, save: hame_state::Save<'_>) -> hame_state::Result<u64> {
        self.inner.put(key, save).await
    }
    async fn delete(&self, key: &StateKey) -> hame_state::Result<bool> {
        self.inner.delete(key).await
    }
    async fn list_sessions(
        &self,
        agent: &str,
        user: Option<&str>,
    ) -> hame_state::Result<Vec<hame_state::SessionSummary>> {
        self.inner.list_sessions(agent, user).await
    }
    async fn try_acquire(
        &self,
        key: &StateKey,
        ttl: std::time::Duration,
    ) -> hame_state::Result<Option<hame_state::Lease>> {
        self.inner.try_acquire(key, ttl).await
    }
    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }
}

impl CountingLoads {
    fn taken(&self) -> usize {
        self.loads.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Saves `session` of alice with `usd` spent on `day`, over whatever it had.
    async fn spend(&self, session: &str, day: &str, usd: f64) -> hame_state::Result<()> {
        let key = StateKey::new("agent", Some("alice"), session)?;
        let stored = self.inner.load(&key).await?;
        let mut state = stored.as_ref().map(|s| s.state.clone()).unwrap_or_default();
        let mut record = SpendRecord::of(&state);
        record.add(day, "openai:m", &spend(1, 1, usd));
        record.store(&mut state);
        self.inner
            .save(&key, &state, stored.map(|s| s.version))
            .await?;
        Ok(())
    }
}

/// A user-day budget reads the user's other sessions: a session unchanged since the last
/// reading is not loaded again, a changed one is, a deleted one stops counting, and a
/// reading serves the calls of the next [`DAY_SPEND_REFRESH`].
#[tokio::test]
async fn a_user_days_other_sessions_are_loaded_once_until_they_change()
-> Result<(), hame_state::Error> {
    let store = CountingLoads::default();
    let day = today();
    store.spend("a", &day, 1.0).await?;
    store.spend("b", &day, 2.0).await?;
    store.spend("c", &day, 4.0).await?;
    // Spent on another day: not counted.
    store.spend("c", "2000-01-01", 8.0).await?;
    let me = StateKey::new("agent", Some("alice"), "a")?;
    let zero = std::time::Duration::ZERO;
    let cache = DaySpendCache::new(zero, zero);
    // The first reading loads every session (the caller's too, for the others' calls).
    let first = others_on(&store, &me, &day, Some(&cache)).await?;
    assert_eq!((first.usd, store.taken()), (6.0, 3));
    let again = others_on(&store, &me, &day, Some(&cache)).await?;
    assert_eq!((again.usd, store.taken()), (6.0, 0));
    // b spends more: only b is read again.
    store.spend("b", &day, 16.0).await?;
    let after = others_on(&store, &me, &day, Some(&cache)).await?;
    assert_eq!((after.usd, store.taken()), (22.0, 1));
    // Another session of the user uses the same reading: a's spend counts for it.
    let b = StateKey::new("agent", Some("alice"), "b")?;
    assert_eq!(others_on(&store, &b, &day, Some(&cache)).await?.usd, 5.0);
    assert_eq!(store.taken(), 0);
    // c is deleted: it no longer counts.
    store
        .delete(&StateKey::new("agent", Some("alice"), "c")?)
        .await?;
    let gone = others_on(&store, &me, &day, Some(&cache)).await?;
    assert_eq!((gone.usd, store.taken()), (18.0, 0));
    // Without a cache, every other session is loaded at every call.
    for _ in 0..2 {
        assert_eq!(others_on(&store, &me, &day, None).await?.usd, 18.0);
        assert_eq!(store.taken(), 1);
    }
    // Within the refresh interval a reading is used as it is; sessions saved less than
    // `settled` ago are loaded again at the next reading.
    let slow = DaySpendCache::new(
        std::time::Duration::from_secs(3600),
        std::time::Duration::from_secs(3600),
    );
    assert_eq!(others_on(&store, &me, &day, Some(&slow)).await?.usd, 18.0);
    assert_eq!(store.taken(), 2);
    store.spend("b", &day, 32.0).await?;
    assert_eq!(others_on(&store, &me, &day, Some(&slow)).await?.usd, 18.0);
    assert_eq!(store.taken(), 0);
    // What this process saves counts at once.
    slow.saved(&b, |_| spend(0, 0, 50.0));
    assert_eq!(others_on(&store, &me, &day, Some(&slow)).await?.usd, 50.0);
    assert_eq!(store.taken(), 0);
    // A reading of another day is not used.
    assert_eq!(
        others_on(&store, &me, "2000-01-01", Some(&slow)).await?.usd,
        0.0
    );
    Ok(())
}

/// A save of this process during a reading is not undone by the reading's older view of
/// that session; a reading cut short lets the next call read.
#[tokio::test]
async fn a_save_during_a_reading_counts_over_the_reading() -> Result<(), Box<dyn std::error::Error>>
{
    let store = CountingLoads::default();
    let day = today();
    store.spend("a", &day, 1.0).await?;
    store.spend("b", &day, 2.0).await?;
    let me = StateKey::new("agent", Some("alice"), "a")?;
    let b = StateKey::new("agent", Some("alice"), "b")?;
    let zero = std::time::Duration::ZERO;
    let cache = DaySpendCache::new(zero, zero);
    assert_eq!(others_on(&store, &me, &day, Some(&cache)).await?.usd, 2.0);
    let tally_of = |cache: &DaySpendCache| -> Result<(f64, f64, bool), String> {
        let users = cache.users.lock().map_err(|_| "poisoned")?;
        let t = users.get(&DaySpendCache::user_of(&me)).ok_or("no tally")?;
        let usd = |s: &str| t.sessions.get(s).map_or(-1.0, |e| e.spend.usd);
        Ok((usd("a"), usd("b"), t.reading_since.is_some()))
    };
    // A reading begins; b's call saves meanwhile; the reading ends with what it loaded
    // before that save.
    let Err(Some(reading)) = cache.recent(&me, &day) else {
        return Err("a reading was due".into());
    };
    assert!(tally_of(&cache)?.2, "a reading in progress");
    let listed = store.list_sessions("agent", Some("alice")).await?;
    cache.saved(&b, |_| spend(0, 0, 40.0));
    let read = listed
        .into_iter()
        .map(|s| {
            let usd = if s.session == "b" { 2.0 } else { 1.0 };
            (s, spend(0, 0, usd))
        })
        .collect();
    cache.finish(reading, &day, read);
    assert_eq!(tally_of(&cache)?, (1.0, 40.0, false));
    // A reading dropped unfinished (its call cancelled) leaves none in progress.
    let Err(Some(cut)) = cache.recent(&me, &day) else {
        return Err("a reading was due".into());
    };
    drop(cut);
    assert!(!tally_of(&cache)?.2);
    Ok(())
}
