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

/// The filesystem operations: `sh -c FS_OPS hame-fs <op> <args...>` (through the command
/// server, `read` of a file larger than `$HAME_FAST` bytes exits [`TOO_BIG`]). Writes and appends
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
  if [ -d "$p" ]; then exit 11; elif [ -f "$p" ]; then
    [ -n "$HAME_FAST" ] && [ "$(stat -c %s "$p")" -gt "$HAME_FAST" ] && exit 17
    exec cat "$p"; elif [ -e "$p" ]; then exit 15; else exit 10; fi ;;
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

/// Polls of the command server, 1 ms apart, for the rest of a command's process group to be
/// reaped before it forks again (see [`SERVER`]): at most ~4 s.
pub(crate) const REAP_POLLS: u32 = 4000;

/// The controller: one long-lived `sh` per container, started with its first command server,
/// that signals a command's process group on request using shell builtins only (`read`,
/// `kill`, `echo`: no fork), so a timed-out or dropped command is killed even while a fork
/// bomb holds every pid of the container (a `docker exec` cannot start then). It reads
/// `<TERM|KILL> <token>` per line, takes the group from `/tmp/.hame-pid-<token>` (written by
/// [`SERVER`]) and answers `sent`, `gone` (no such group any more) or `none` (no command of
/// that token runs).
pub(crate) const CONTROLLER: &str = r#"while read -r s t; do
  case $s in TERM|KILL) ;; *) echo bad; continue ;; esac
  f="/tmp/.hame-pid-$t"; p=
  [ -f "$f" ] && read -r p < "$f"
  case $p in ''|*[!0-9]*) echo none; continue ;; esac
  if kill -"$s" -"$p" 2>/dev/null; then echo sent; else echo gone; fi
done"#;

/// Kills the process group of the command with token `$0` (its leader's pid is in
/// `/tmp/.hame-pid-<token>`, written by [`SERVER`]): `SIGTERM`, then `SIGKILL`
/// after `$1` microseconds.
pub(crate) const KILL_GROUP: &str = r#"f="/tmp/.hame-pid-$0"
p=$(cat "$f" 2>/dev/null) || exit 0
kill -TERM -"$p" 2>/dev/null
usleep "$1"
kill -KILL -"$p" 2>/dev/null
rm -f "$f"
exit 0"#;

/// One process per snapshot (through the command server `$HAME_FAST` is set to the
/// largest archive it may send; a larger one exits [`TOO_BIG`] before the marker moves):
/// lists every file of `/workspace` on stderr
/// (`size mode mtime ./path`) and writes on stdout a tar of the files modified since the
/// last snapshot's marker (all files when there is none), projection roots and temporary
/// files left out; then moves the marker forward. It also prints `marker <seconds>`, the
/// marker's time: busybox's `-newer` compares whole seconds, so the caller reads again the
/// files modified in the marker's second.
pub(crate) const SNAPSHOT: &str = r#"cd /workspace || exit 1
M=/tmp/.hame-snap-marker
touch /tmp/.hame-snap-next
find . -type f -exec stat -c '%s %a %Y %n' {} + >&2
N=""; [ -e $M ] && N="-newer $M" && echo "marker $(stat -c %Y $M)" >&2
find . -type f $N ! -name '.hame-tmp-*' ! -path ./AGENTS.md ! -path ./tools.json ! -path './skills/*' ! -path './subagents/*' ! -path './knowledge/*' > /tmp/.hame-snap-list
if [ -n "$HAME_FAST" ]; then
  s=$(tr '\n' '\0' < /tmp/.hame-snap-list | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
  [ "$s" -gt "$HAME_FAST" ] && exit 17
fi
mv /tmp/.hame-snap-next $M
set --
while IFS= read -r f; do set -- "$@" "$f"; done < /tmp/.hame-snap-list
[ $# -gt 0 ] && exec tar -cf - "$@"
exit 0"#;

/// Extracts a tar from stdin into `/workspace` and starts the snapshot marker.
pub(crate) const RESTORE: &str = "cd /workspace && tar -xf - && touch /tmp/.hame-snap-marker";

/// Writes the container's state file `/tmp/.hame-sandbox`: `$1` the status (`idle` when a
/// call ended with its snapshot stored, `busy` while a call runs), `$2` the identity of
/// the manifest of its last snapshot, `$3` the owner (`<pid>:<start time>` of the process
/// that uses it). Its time is when the status was written (for `idle`: when the container
/// went idle).
pub(crate) const STATE_WRITE: &str = r#"printf '%s\n%s\n%s\n' "$1" "$2" "$3" > /tmp/.hame-sandbox.t && mv -f /tmp/.hame-sandbox.t /tmp/.hame-sandbox"#;

/// The container's main process (under Docker's init): every `$2` seconds it looks at the
/// state file and exits, ending the container (which the engine then removes), once the
/// file says `idle` and is older than `$1` seconds. So a container whose process died, or
/// that was left for the next process, never outlives its idle TTL (+ grace) even when no
/// hame process runs any more. A container in the middle of a call is never ended.
pub(crate) const WATCHDOG: &str = r#"f=/tmp/.hame-sandbox
while sleep "$2"; do
  [ -f $f ] || continue
  [ "$(head -n 1 $f)" = idle ] || continue
  [ $(( $(date +%s) - $(stat -c %Y $f) )) -gt "$1" ] && exit 0
done"#;

/// Prints `state`, the state file's three lines and the seconds since it was written;
/// exits 1 without a state file.
pub(crate) const STATE_READ: &str = r#"f=/tmp/.hame-sandbox
[ -f $f ] || exit 1
echo state; cat $f; echo $(( $(date +%s) - $(stat -c %Y $f) ))"#;

/// SHA-256 of every file under the projection roots (`hash  ./path`); a call begins, so the
/// state file says `busy` for the owner `$1`.
pub(crate) const PROJECTION_HASHES: &str = r#"printf 'busy\n\n%s\n' "$1" > /tmp/.hame-sandbox.t && mv -f /tmp/.hame-sandbox.t /tmp/.hame-sandbox
cd /workspace || exit 1
for r in AGENTS.md skills subagents knowledge tools.json; do
  [ -e "$r" ] && find "./$r" -type f -exec sha256sum {} +
done
exit 0"#;

/// Deletes the given paths below `/workspace` (`$@`).
pub(crate) const REMOVE: &str = r#"cd /workspace || exit 1
rm -f "$@"
exit 0"#;

/// Exit code of a fast-path script: the output would be too large for the command server's
/// temporary files; the caller runs it again as its own `docker exec`.
pub(crate) const TOO_BIG: i64 = 17;

/// Largest output a script sends through the command server (the rest goes the slow way).
pub(crate) const FAST_OUTPUT_BYTES: u64 = 8 << 20;

/// The command server: one long-lived `sh` per warm container, so a warm command costs
/// no `docker exec` (Docker's own exec set-up is ~55 ms here). It reads one request per
/// line from stdin, `<token> <stdin bytes> <cap> <base64 of the command text>`, followed
/// by exactly `<stdin bytes>` bytes of input (read by `dd`, which never reads past them).
/// It runs the command as `sh FILE` in a new session (`setsid`: its process group is the
/// one [`KILL_GROUP`] kills, its pid recorded in `/tmp/.hame-pid-<token>`), stdout and
/// stderr to files in `/tmp`, and answers `P <pid>` at once, then, when the command has
/// ended and what is left of its process group is killed,
/// `D <exit> <stdout bytes> <stderr bytes> <sent stdout> <sent stderr>`, the first
/// `<cap>` bytes of each stream, and `E`. One request at a time; the host keeps a pool of
/// servers per container for concurrent calls.
///
/// A fork bomb must not take the server with it: busybox `sh` exits when a fork fails, and
/// a bomb holds every pid of the container until its processes are killed and reaped. So
/// between the command's end and the server's next fork only shell builtins run: the
/// group is killed (`kill` is a builtin) and the server waits, polling with `kill -0`
/// and sleeping with `read -t` on a FIFO (no process either), until init has reaped the
/// whole group (at most `$1` polls of 1 ms: [`REAP_POLLS`]).
pub(crate) const SERVER: &str = r#"q=/tmp/.hame-tick
[ -p $q ] || mkfifo $q 2>/dev/null
while IFS=' ' read -r t n c b; do
  [ -n "$b" ] || exit 2
  i=/dev/null
  if [ "$n" -gt 0 ]; then i="/tmp/.hame-i-$t"; dd of="$i" bs="$n" count=1 iflag=fullblock 2>/dev/null || exit 3; fi
  f="/tmp/.hame-c-$t"; o="/tmp/.hame-o-$t"; e="/tmp/.hame-e-$t"
  printf %s "$b" | base64 -d > "$f" || exit 4
  setsid sh "$f" < "$i" > "$o" 2> "$e" &
  p=$!
  echo "$p" > "/tmp/.hame-pid-$t"
  echo "P $p"
  wait "$p"; x=$?
  kill -KILL -"$p" 2>/dev/null
  k=0; while kill -0 -"$p" 2>/dev/null && [ $k -lt "$1" ]; do k=$((k+1)); read -t 0.001 z <> $q; done
  so=$(stat -c %s "$o"); se=$(stat -c %s "$e")
  ko=$so; [ "$ko" -gt "$c" ] && ko=$c
  ke=$se; [ "$ke" -gt "$c" ] && ke=$c
  echo "D $x $so $se $ko $ke"
  head -c "$ko" "$o"; head -c "$ke" "$e"
  echo E
  rm -f "$f" "$o" "$e" "/tmp/.hame-pid-$t"
  [ "$i" = /dev/null ] || rm -f "$i"
done"#;
