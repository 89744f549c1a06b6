//! [`Extensions`]: typed values a caller hands to every layer and tool of one call.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A typed map, one value per type, cheap to clone (`Arc` inside).
///
/// The harness puts the caller's tenant workspace handle here before a call starts, so
/// every layer ([`CallCtx::extensions`](crate::CallCtx::extensions)) and every tool
/// ([`ToolContext::extensions`](crate::ToolContext::extensions)) reaches the same files,
/// state and identity. Applications can add their own values the same way (a request id,
/// a database pool), like `http::Extensions` in the HTTP stack.
///
/// ```
/// use hame_core::Extensions;
/// #[derive(Debug, PartialEq)]
/// struct RequestId(u64);
/// let mut ext = Extensions::new();
/// ext.insert(RequestId(7));
/// assert_eq!(ext.get::<RequestId>(), Some(&RequestId(7)));
/// assert!(ext.get::<String>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct Extensions {
    map: Arc<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Extensions {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `value`, replacing the value of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        Arc::make_mut(&mut self.map).insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// Inserts a shared value, replacing the value of the same type.
    pub fn insert_arc<T: Any + Send + Sync>(&mut self, value: Arc<T>) {
        Arc::make_mut(&mut self.map).insert(TypeId::of::<T>(), value);
    }

    /// The value of type `T`, if one was inserted.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.map
            .get(&TypeId::of::<T>())
            .and_then(|v| v.downcast_ref::<T>())
    }

    /// The value of type `T` as a shared pointer, if one was inserted.
    pub fn get_arc<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.map
            .get(&TypeId::of::<T>())
            .cloned()
            .and_then(|v| v.downcast::<T>().ok())
    }

    /// How many values the map holds.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extensions")
            .field("len", &self.map.len())
            .finish()
    }
}
