//! The shell scripts the sandbox runs inside the container (busybox `sh` is enough).
//!
//! Filesystem operations exit with these codes, mapped back to `hame_fs` errors.

/// Exit code: no such file or directory.
pub(crate) const NOT_FOUND: i64 = 10;
/// Exit code: is a directory.
pub(crate) const IS_DIR: i64 = 11;
/// Exit code: a parent is not a directory.
pub(crate) const NOT_DIR: i64 = 12;
/// Exit code: already exists.
pub(crate) const EXISTS: i64 = 13;
/// Exit code: compare-and-set lost.
pub(crate) const CONFLICT: i64 = 14;
/// Exit code: permission denied (or not a regular file).
pub(crate) const DENIED: i64 = 15;
/// Exit code: invalid move (into itself, the root).
pub(crate) const INVALID: i64 = 16;

/// The filesystem operations: `sh -c FS_OPS hame-fs <op> <args...>`. Writes and appends
/// take one lock directory in `/tmp`, so compare-and-set and appends are atomic between
/// every writer of the container that goes through these scripts.
pub(crate) const FS_OPS: &str = r#"
L=/tmp/.hame-lock
lock() { n=0; while ! mkdir "$L" 2>/dev/null; do n=$((n+1)); [ $n -gt 10000 ] && rmdir "$L" 2>/dev/null; usleep 1000; done; }
unlock() { rmdir "$L" 2>/dev/null; }
parents() { d=$(dirname "$1"); while [ "$d" != / ] && [ "$d" != /workspace ]; do if [ -e "$d" ] && [ ! -d "$d" ]; then exit 12; fi; d=$(dirname "$d"); done; }
op=$1; p=$2
case $op in
stat)
  if [ -d "$p" ]; then echo "d 0 $(stat -c %Y "$p")"; elif [ -f "$p" ]; then stat -c 'f %s %Y' "$p"; elif [ -e "$p" ]; then exit 15; else exit 10; fi ;;
list)
  [ -e "$p" ] || exit 10; [ -d "$p" ] || exit 12
  find "$p" -mindepth 1 -maxdepth 1 -exec stat -L -c '%F|%s|%Y|%n' {} + 2>/dev/null; exit 0 ;;
read)
  if [ -d "$p" ]; then exit 11; elif [ -f "$p" ]; then exec cat "$p"; elif [ -e "$p" ]; then exit 15; else exit 10; fi ;;
write)
  parents "$p"; [ -d "$p" ] && exit 11
  d=$(dirname "$p"); mkdir -p "$d" 2>/dev/null || exit 15
  t="$d/.hame-tmp-$$"
  cat > "$t" || { rm -f "$t"; exit 15; }
  lock
  case $3 in
  c) if [ -e "$p" ]; then unlock; rm -f "$t"; exit 13; fi ;;
  m) if [ ! -f "$p" ] || [ "$(sha256sum < "$p")" != "$4  -" ]; then unlock; rm -f "$t"; exit 14; fi ;;
  esac
  mv -f "$t" "$p" || { unlock; rm -f "$t"; exit 15; }
  unlock ;;
append)
  parents "$p"; [ -d "$p" ] && exit 11
  mkdir -p "$(dirname "$p")" 2>/dev/null || exit 15
  lock; cat >> "$p"; s=$?; unlock; [ $s = 0 ] || exit 15 ;;
delete)
  [ -e "$p" ] || exit 10
  [ "$p" = /workspace ] && exit 15
  if [ -d "$p" ]; then [ "$3" = 1 ] || exit 11; rm -rf "$p" || exit 15; else rm -f "$p" || exit 15; fi ;;
rename)
  t=$3
  [ -e "$p" ] || exit 10
  parents "$t"
  if [ -d "$p" ]; then
    case "$t/" in "$p"/*) exit 16 ;; esac
    [ -e "$t" ] && exit 13
  else
    [ -d "$t" ] && exit 11
    if [ -e "$t" ] && [ "$4" != 1 ]; then exit 13; fi
  fi
  mkdir -p "$(dirname "$t")" 2>/dev/null || exit 15
  mv -f "$p" "$t" || exit 15 ;;
*) echo "unknown operation $op" >&2; exit 2 ;;
esac
"#;

/// Runs a command in the shell that leads its own process group (a `docker exec` process
/// leads its group) after recording its pid in `/tmp/.hame-pid-<token>` for
/// [`KILL_GROUP`]: one process, no fork before the command. `$0` is the token, `$1` the
/// command (stdin is not attached: it reads as empty).
pub(crate) const EXEC_WRAPPER: &str = r#"echo $$ > "/tmp/.hame-pid-$0"; eval "$1""#;

/// Kills the process group of the command with token `$0`: `SIGTERM`, then `SIGKILL`
/// after `$1` microseconds.
pub(crate) const KILL_GROUP: &str = r#"f="/tmp/.hame-pid-$0"
p=$(cat "$f" 2>/dev/null) || exit 0
kill -TERM -"$p" 2>/dev/null
usleep "$1"
kill -KILL -"$p" 2>/dev/null
rm -f "$f"
exit 0"#;

/// One process per snapshot: lists every file of `/workspace` on stderr
/// (`size mode mtime ./path`) and writes on stdout a tar of the files modified since the
/// last snapshot's marker (all files when there is none), projection roots and temporary
/// files left out; then moves the marker forward.
pub(crate) const SNAPSHOT: &str = r#"cd /workspace || exit 1
M=/tmp/.hame-snap-marker
touch /tmp/.hame-snap-next
find . -type f -exec stat -c '%s %a %Y %n' {} + >&2
N=""; [ -e $M ] && N="-newer $M"
find . -type f $N ! -name '.hame-tmp-*' ! -path ./AGENTS.md ! -path ./tools.json ! -path './skills/*' ! -path './subagents/*' ! -path './knowledge/*' > /tmp/.hame-snap-list
mv /tmp/.hame-snap-next $M
set --
while IFS= read -r f; do set -- "$@" "$f"; done < /tmp/.hame-snap-list
[ $# -gt 0 ] && exec tar -cf - "$@"
exit 0"#;

/// Extracts a tar from stdin into `/workspace` and starts the snapshot marker.
pub(crate) const RESTORE: &str = "cd /workspace && tar -xf - && touch /tmp/.hame-snap-marker";

/// SHA-256 of every file under the projection roots (`hash  ./path`).
pub(crate) const PROJECTION_HASHES: &str = r#"cd /workspace || exit 1
for r in AGENTS.md skills subagents knowledge tools.json; do
  [ -e "$r" ] && find "./$r" -type f -exec sha256sum {} +
done
exit 0"#;

/// Deletes the given paths below `/workspace` (`$@`).
pub(crate) const REMOVE: &str = r#"cd /workspace || exit 1
rm -f "$@"
exit 0"#;
