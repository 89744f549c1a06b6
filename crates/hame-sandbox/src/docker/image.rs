//! The default image, built offline from a static busybox of the host (Debian's
//! `busybox-static`): `FROM scratch`, the binary, one symlink per applet, a `hame` user
//! (uid 1000) and an empty `/workspace`. No registry is contacted.

use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::query_parameters::BuildImageOptions;
use futures::StreamExt;

use crate::error::{Error, Result};

/// The default image's tag. Bumped when its content changes.
pub const DEFAULT_IMAGE: &str = "hame-sandbox:busybox-1";

/// Where a static busybox is looked for when none is given (Debian's `busybox-static`
/// installs `/bin/busybox`; on merged-`/usr` systems that is `/usr/bin/busybox`).
pub const BUSYBOX_CANDIDATES: [&str; 3] =
    ["/bin/busybox", "/usr/bin/busybox", "/usr/local/bin/busybox"];

const DOCKERFILE: &str = "FROM scratch
COPY rootfs/ /
ENV PATH=/bin LANG=C.UTF-8 HOME=/workspace
USER 1000:1000
WORKDIR /workspace
LABEL hame.sandbox.image=\"busybox-1\"
CMD [\"sleep\", \"2147483647\"]
";

/// Whether an ELF file is statically linked (no `PT_INTERP` program header).
pub(crate) fn is_static_elf(bytes: &[u8]) -> bool {
    let u16_at = |o: usize| {
        bytes
            .get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bytes.get(o..o + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    // 64-bit little-endian ELF only (the machines hame's sandbox runs on).
    if bytes.get(0..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let at = phoff + i * usize::from(phentsize);
        matches!(u32_at(at), Some(t) if t != 3)
    })
}

/// Finds a static busybox: `given`, else the first of [`BUSYBOX_CANDIDATES`] that is one.
pub fn find_busybox(given: Option<&Path>) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match given {
        Some(p) => vec![p.to_path_buf()],
        None => BUSYBOX_CANDIDATES.iter().map(PathBuf::from).collect(),
    };
    for c in &candidates {
        if let Ok(bytes) = std::fs::read(c) {
            if is_static_elf(&bytes) {
                return Ok(c.clone());
            }
            if given.is_some() {
                return Err(Error::Image(format!(
                    "{} is not a statically linked busybox",
                    c.display()
                )));
            }
        }
    }
    Err(Error::Image(
        "no static busybox found to build the default image: install Debian's busybox-static \
         (apt-get install busybox-static) or set HAME_SANDBOX_BUSYBOX"
            .into(),
    ))
}

/// The build context: Dockerfile and `rootfs/`.
async fn context(busybox: &Path) -> Result<Vec<u8>> {
    let binary = tokio::fs::read(busybox)
        .await
        .map_err(|e| Error::Image(format!("cannot read {}: {e}", busybox.display())))?;
    let listed = tokio::process::Command::new(busybox)
        .arg("--list")
        .output()
        .await
        .map_err(|e| Error::Image(format!("cannot run {} --list: {e}", busybox.display())))?;
    let applets = String::from_utf8_lossy(&listed.stdout).into_owned();
    let mut tar = tar::Builder::new(Vec::new());
    let file = |tar: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, path, data)
    };
    let dir = |tar: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, uid: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Directory);
        tar.append_data(&mut h, path, &[][..])
    };
    let io = |e: std::io::Error| Error::Image(format!("cannot assemble the build context: {e}"));
    file(&mut tar, "Dockerfile", DOCKERFILE.as_bytes(), 0o644).map_err(io)?;
    for (d, mode, uid) in [
        ("rootfs/bin", 0o755, 0),
        ("rootfs/etc", 0o755, 0),
        ("rootfs/tmp", 0o1777, 0),
        ("rootfs/workspace", 0o755, 1000),
    ] {
        dir(&mut tar, d, mode, uid).map_err(io)?;
    }
    file(&mut tar, "rootfs/bin/busybox", &binary, 0o755).map_err(io)?;
    file(
        &mut tar,
        "rootfs/etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\nhame:x:1000:1000:hame:/workspace:/bin/sh\n",
        0o644,
    )
    .map_err(io)?;
    file(
        &mut tar,
        "rootfs/etc/group",
        b"root:x:0:\nhame:x:1000:\n",
        0o644,
    )
    .map_err(io)?;
    for applet in applets.split_whitespace() {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Symlink);
        tar.append_link(&mut h, format!("rootfs/bin/{applet}"), "busybox")
            .map_err(io)?;
    }
    tar.into_inner().map_err(io)
}

/// Builds [`DEFAULT_IMAGE`] through the engine's build API from `busybox` (see
/// [`find_busybox`]), without a registry (`FROM scratch`, no network during the build).
pub(crate) async fn build(docker: &Docker, busybox: &Path) -> Result<String> {
    let body = context(busybox).await?;
    let options = BuildImageOptions {
        dockerfile: "Dockerfile".into(),
        t: Some(DEFAULT_IMAGE.into()),
        rm: true,
        forcerm: true,
        networkmode: Some("none".into()),
        ..Default::default()
    };
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(body.into())));
    while let Some(item) = stream.next().await {
        let info =
            item.map_err(|e| Error::Image(format!("building {DEFAULT_IMAGE} failed: {e}")))?;
        if let Some(detail) = info.error_detail {
            return Err(Error::Image(format!(
                "building {DEFAULT_IMAGE} failed: {}",
                detail.message.unwrap_or_default()
            )));
        }
    }
    docker
        .inspect_image(DEFAULT_IMAGE)
        .await
        .map_err(|e| Error::Image(format!("{DEFAULT_IMAGE} is missing after its build: {e}")))?;
    Ok(DEFAULT_IMAGE.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn static_check() {
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        assert!(!is_static_elf(&[]));
        // The test binary itself is dynamically linked.
        if let Ok(me) = std::env::current_exe().and_then(std::fs::read) {
            assert!(!is_static_elf(&me));
        }
    }
}
