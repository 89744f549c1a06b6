//! What the state benches share: one tokio runtime, and a panic with the store's message.

use std::sync::LazyLock;

use tokio::runtime::Runtime;

/// The runtime every bench drives the store on.
pub static RT: LazyLock<Runtime> = LazyLock::new(|| match Runtime::new() {
    Ok(rt) => rt,
    Err(e) => panic!("tokio runtime: {e}"),
});

/// The value, or a panic with the store's error (a bench has nobody to return it to).
pub fn ok<T>(r: hame_state::Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}
