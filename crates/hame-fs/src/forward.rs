//! [`forward_filesystem!`](crate::forward_filesystem): the one way a wrapper implements
//! [`Filesystem`](crate::Filesystem), so that it cannot forget a method.

/// Implements [`Filesystem`](crate::Filesystem) for a wrapper: every method is either
/// **forwarded** unchanged to the inner filesystem or **overridden** by an `async fn` given
/// in the invocation, and the wrapper does not compile unless each of the thirteen methods is
/// named exactly once.
///
/// Without it, a wrapper that forgets a *specialisable* method (one with a default, such as
/// `grep` or `read_range`) still compiles: the generic fallback runs over the wrapper,
/// which silently replaces the backend's native version (or, for a policy wrapper, skips
/// the policy if the fallback is not built on the policed methods). With it, a forgotten
/// method is a compile error naming the method (`not all trait items implemented, missing:
/// `grep``), a method named twice is a duplicate definition, and a misspelled one is not a
/// member of the trait.
///
/// ```
/// use hame_fs::{AppendOptions, Error, Filesystem, FsPath, InMemoryFs, Result, Version, WriteOptions};
///
/// /// Refuses files over a size; everything else goes to the inner filesystem.
/// #[derive(Debug)]
/// struct SizeLimit<F> {
///     inner: F,
///     max: usize,
/// }
///
/// hame_fs::forward_filesystem! {
///     impl[F: Filesystem] Filesystem for SizeLimit<F> {
///         // How to reach the inner filesystem from `&self` (any expression of `s`).
///         inner = |s| &s.inner;
///         // Forwarded unchanged.
///         forward = [
///             stat, list, read_bytes, delete, rename, exists, read_range, edit, grep, glob,
///             list_many,
///         ];
///         // Overridden (the generics and `where` clause of the impl are in scope).
///         async fn write(
///             &self,
///             path: &FsPath,
///             data: Vec<u8>,
///             options: WriteOptions,
///         ) -> Result<Version> {
///             if data.len() > self.max {
///                 let (size, limit) = (data.len() as u64, self.max as u64);
///                 return Err(Error::TooLarge { path: path.to_string(), size, limit });
///             }
///             self.inner.write(path, data, options).await
///         }
///         async fn append(
///             &self,
///             path: &FsPath,
///             data: Vec<u8>,
///             options: AppendOptions,
///         ) -> Result<()> {
///             // Through our own `write`, so the limit holds for appends as well.
///             hame_fs::generic::append_via_cas(self, path, data, options).await
///         }
///     }
/// }
///
/// # async fn demo() -> Result<()> {
/// let fs = SizeLimit { inner: InMemoryFs::new(), max: 4 };
/// let p = FsPath::parse("a")?;
/// fs.write(&p, b"1234".to_vec(), WriteOptions::default()).await?;
/// let refused = fs.append(&p, b"5".to_vec(), AppendOptions::default()).await;
/// assert_eq!(refused.map_err(|e| e.code()), Err("too_large"));
/// # Ok(()) }
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(demo()).unwrap();
/// ```
///
/// A wrapper that forgets a method does not compile (here `glob`, whose generic fallback
/// would otherwise walk the wrapper silently):
///
/// ```compile_fail,E0046
/// use hame_fs::{Filesystem, InMemoryFs};
///
/// #[derive(Debug)]
/// struct Forgetful(InMemoryFs);
///
/// hame_fs::forward_filesystem! {
///     impl Filesystem for Forgetful {
///         inner = |s| &s.0;
///         forward = [
///             stat, list, read_bytes, write, delete, rename, exists, read_range, append, edit,
///             grep, list_many,
///         ];
///     }
/// }
/// ```
///
/// Syntax: `impl[<generics>] Filesystem for <type> [where [<predicates>]] { ... }` (the
/// generics go in square brackets; the `where` predicates too), then optionally
/// `inner = |s| <expr>; forward = [<methods>];` (both or neither: a wrapper that overrides
/// every method, like a router, gives neither), then the overriding `async fn`s. The
/// thirteen methods are `stat, list, read_bytes, write, delete, rename, exists, read_range,
/// append, edit, grep, glob, list_many`. The conveniences of [`FilesystemExt`](crate::FilesystemExt)
/// are not listed: they cannot be overridden.
#[macro_export]
macro_rules! forward_filesystem {
    (
        impl $([$($gen:tt)*])? Filesystem for $ty:ty $(where [$($wc:tt)*])? {
            $(
                inner = |$s:ident| $e:expr;
                forward = [$($fwd:ident),* $(,)?];
            )?
            $(
                $(#[$attr:meta])*
                async fn $name:ident ($($args:tt)*) -> $ret:ty $body:block
            )*
        }
    ) => {
        $crate::forward_filesystem!(@munch
            head [$($($gen)*)?] [$ty] [$($($wc)*)?]
            inner [$($s)?] [$($e)?]
            todo [$($($fwd)*)?]
            done []
            items [$($(#[$attr])* async fn $name ($($args)*) -> $ret $body)*]
        );
        const _: () = {
            // Names every method once: a missing, repeated or unknown name fails here.
            #[allow(dead_code)]
            struct EveryMethodNamedOnce;
            impl $crate::__private::EveryFilesystemMethod for EveryMethodNamedOnce {
                $($(fn $fwd() {})*)?
                $(fn $name() {})*
            }
        };
    };

    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [stat $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn stat(&self, path: &$crate::FsPath) -> $crate::Result<$crate::FileInfo> {
                    let $s = self;
                    $crate::Filesystem::stat($e, path).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [list $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn list(
                    &self,
                    path: &$crate::FsPath,
                ) -> $crate::Result<::std::vec::Vec<$crate::FileInfo>> {
                    let $s = self;
                    $crate::Filesystem::list($e, path).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [read_bytes $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn read_bytes(
                    &self,
                    path: &$crate::FsPath,
                ) -> $crate::Result<::std::vec::Vec<u8>> {
                    let $s = self;
                    $crate::Filesystem::read_bytes($e, path).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [write $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn write(
                    &self,
                    path: &$crate::FsPath,
                    data: ::std::vec::Vec<u8>,
                    options: $crate::WriteOptions,
                ) -> $crate::Result<$crate::Version> {
                    let $s = self;
                    $crate::Filesystem::write($e, path, data, options).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [delete $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn delete(
                    &self,
                    path: &$crate::FsPath,
                    options: $crate::DeleteOptions,
                ) -> $crate::Result<()> {
                    let $s = self;
                    $crate::Filesystem::delete($e, path, options).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [rename $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn rename(
                    &self,
                    from: &$crate::FsPath,
                    to: &$crate::FsPath,
                    options: $crate::RenameOptions,
                ) -> $crate::Result<()> {
                    let $s = self;
                    $crate::Filesystem::rename($e, from, to, options).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [exists $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn exists(&self, path: &$crate::FsPath) -> $crate::Result<bool> {
                    let $s = self;
                    $crate::Filesystem::exists($e, path).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [read_range $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn read_range(
                    &self,
                    path: &$crate::FsPath,
                    offset: u64,
                    len: u64,
                ) -> $crate::Result<::std::vec::Vec<u8>> {
                    let $s = self;
                    $crate::Filesystem::read_range($e, path, offset, len).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [append $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn append(
                    &self,
                    path: &$crate::FsPath,
                    data: ::std::vec::Vec<u8>,
                    options: $crate::AppendOptions,
                ) -> $crate::Result<()> {
                    let $s = self;
                    $crate::Filesystem::append($e, path, data, options).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [edit $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn edit(
                    &self,
                    path: &$crate::FsPath,
                    request: &$crate::EditRequest,
                ) -> $crate::Result<$crate::EditOutcome> {
                    let $s = self;
                    $crate::Filesystem::edit($e, path, request).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [grep $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn grep(
                    &self,
                    request: &$crate::GrepRequest,
                ) -> $crate::Result<$crate::GrepOutput> {
                    let $s = self;
                    $crate::Filesystem::grep($e, request).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [glob $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn glob(
                    &self,
                    request: &$crate::GlobRequest,
                ) -> $crate::Result<$crate::GlobOutput> {
                    let $s = self;
                    $crate::Filesystem::glob($e, request).await
                }
            ] items $items);
    };
    (@munch head $h:tt $t:tt $w:tt inner [$s:ident] [$e:expr]
        todo [list_many $($todo:ident)*] done [$($done:tt)*] items $items:tt) => {
        $crate::forward_filesystem!(@munch head $h $t $w inner [$s] [$e] todo [$($todo)*]
            done [$($done)*
                async fn list_many(
                    &self,
                    requests: &[$crate::ListRequest],
                ) -> $crate::Result<::std::vec::Vec<$crate::Result<$crate::Listing>>> {
                    let $s = self;
                    $crate::Filesystem::list_many($e, requests).await
                }
            ] items $items);
    };
    (@munch head [$($gen:tt)*] [$ty:ty] [$($wc:tt)*] inner $s:tt $e:tt
        todo [] done [$($done:tt)*] items [$($items:tt)*]) => {
        #[$crate::__private::async_trait]
        impl<$($gen)*> $crate::Filesystem for $ty where $($wc)* {
            $($done)*
            $($items)*
        }
    };
}

#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;

    /// One item per method of [`Filesystem`](crate::Filesystem). `forward_filesystem!`
    /// implements it with the names it was given, so rustc reports a method that is
    /// missing, repeated or unknown. Keep it, the trait and the macro's table in step: a new
    /// trait method goes into all three.
    pub trait EveryFilesystemMethod {
        fn stat();
        fn list();
        fn read_bytes();
        fn write();
        fn delete();
        fn rename();
        fn exists();
        fn read_range();
        fn append();
        fn edit();
        fn grep();
        fn glob();
        fn list_many();
    }
}
