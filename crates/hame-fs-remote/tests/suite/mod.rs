#[cfg(any(feature = "redis", feature = "object-store"))]
mod support;

#[cfg(feature = "object-store")]
mod object_store;
#[cfg(feature = "redis")]
mod redis;
