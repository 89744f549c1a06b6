"""Drives the `hame serve` console in headless Chromium over the DevTools protocol.

argv: DevTools port, the server's base URL, the screenshot directory, the long session id.
Prints one JSON object of what it saw; the Rust test asserts on it. A step that times out
leaves a screenshot named after it and fails with the page's text.
"""
import base64
import json
import sys
import time
import urllib.request

from websockets.sync.client import connect

port, base, shots, long_id = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
page = next(t for t in targets if t["type"] == "page")
ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=20, legacy=True)
seq = 0


def call(method, **params):
    global seq
    seq += 1
    ws.send(json.dumps({"id": seq, "method": method, "params": params}))
    while True:
        m = json.loads(ws.recv(timeout=30))
        if m.get("id") == seq:
            if "error" in m:
                raise RuntimeError(f"{method}: {m['error']}")
            return m.get("result", {})


def js(expr):
    r = call("Runtime.evaluate", expression=expr, awaitPromise=True, returnByValue=True)
    if "exceptionDetails" in r:
        raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
    return r["result"].get("value")


def shot(name):
    data = call("Page.captureScreenshot", format="png")["data"]
    with open(f"{shots}/{name}.png", "wb") as f:
        f.write(base64.b64decode(data))


def until(expr, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = js(expr)
        if v:
            return v
        time.sleep(0.1)
    shot(f"timeout-{what}")
    raise RuntimeError(f"timed out waiting for {what}; page: {js('document.body.innerText')!r}")


def send(text):
    js(f"$('input').value = {json.dumps(text)}; $('send').requestSubmit(); true")


LOG_TEXT = "document.getElementById('log').innerText"
out = {}
call("Page.enable")
call("Emulation.setDeviceMetricsOverride", width=1200, height=700, deviceScaleFactor=1, mobile=False)

# A message: the reply appears, and the log is scrolled to it.
call("Page.navigate", url=base + "/#/s/web")
until("document.readyState === 'complete' && $('current').textContent === 'web'", "load")
until(f"{LOG_TEXT}.includes('No messages yet')", "empty-session")
# The scripted reply can come and go between two polls: an observer notes that busy was
# shown at all (polling for it lost that race once under the whole suite).
js("window.busySeen = false; new MutationObserver(() => { if ($('busy').classList.contains('on')) "
   "window.busySeen = true; }).observe($('busy'), {attributes: true}); true")
send("hello console")
until("window.busySeen", "busy-for-reply", timeout=10)
until(f"{LOG_TEXT}.includes('Console reply from the agent.') && !$('busy').classList.contains('on')", "reply")
out["reply"] = js("""(() => {
  const log = $('log'), last = [...log.querySelectorAll('.msg.assistant')].pop();
  const l = log.getBoundingClientRect(), r = last.getBoundingClientRect();
  return {scrollTop: log.scrollTop, overflow: log.scrollHeight - log.clientHeight,
          lastVisible: r.bottom <= l.bottom + 2 && r.bottom >= l.top,
          lastText: last.innerText.slice(-40), hash: location.hash};
})()""")
shot("1-reply")

# A reload keeps the session (the address has it).
call("Page.reload")
time.sleep(0.3)
until("document.readyState === 'complete' && $('current').textContent === 'web' && "
      f"{LOG_TEXT}.includes('Console reply from the agent.')", "reload")
out["reload"] = js("({hash: location.hash, current: $('current').textContent, "
                   "sent: [...document.querySelectorAll('.msg.user')].map(e => e.innerText)})")
shot("2-reloaded")

# A long command: busy with a stop button; stop cancels the run.
send("run the long job")
until("$('busy').classList.contains('on') && $('busytext').textContent.includes(' s')", "busy-long", timeout=20)
# The run is claimed and its model request answered at once: wait until it runs, then
# give the shell a moment to start the command.
until("fetch('/v1/sessions/web/runs').then(r => r.json()).then(b => b.runs[0].status === 'running')",
      "run-running", timeout=20)
# The page shows the tool only once it ends, so there is no sign to wait for: 3 s (1.5 s
# lost the race once with the whole suite running beside it).
time.sleep(3)
out["busy"] = js("({stopVisible: $('stop').offsetParent !== null, stopEnabled: !$('stop').disabled, "
                 "sendDisabled: $('sendbtn').disabled, text: $('busytext').textContent})")
shot("3-busy")
started = time.time()
js("$('stop').click(); true")
until("!$('busy').classList.contains('on')", "stopped", timeout=20)
out["stopped"] = {"seconds": round(time.time() - started, 2),
                  "note": js(f"{LOG_TEXT}.includes('Stopped: the run was cancelled.')"),
                  "toolShown": js(f"{LOG_TEXT}.includes('⚙ execute')"),
                  "sendEnabled": js("!$('sendbtn').disabled")}
shot("4-stopped")

# A bad session id: a sentence, not JSON.
call("Page.navigate", url=base + "/#/s/bad%20id%3F")
until("$('current').textContent === 'bad id?' && !!document.querySelector('#log .msg.error')", "bad-id")
out["bad_id"] = js("document.querySelector('#log .msg.error').innerText")
shot("5-bad-id")

# A long id wraps in the sidebar and the heading instead of overflowing.
call("Page.navigate", url=base + "/#/s/" + long_id)
until(f"$('current').textContent === {json.dumps(long_id)} && "
      f"[...document.querySelectorAll('li.session.current')].some(li => li.title === {json.dumps(long_id)})", "long-id")
out["long_id"] = js(f"""(() => {{
  const aside = document.querySelector('aside'), main = document.querySelector('main');
  const li = [...document.querySelectorAll('li.session')].find(li => li.title === {json.dumps(long_id)});
  return {{asideOverflow: aside.scrollWidth - aside.clientWidth, mainOverflow: main.scrollWidth - main.clientWidth,
          liLines: Math.round(li.getBoundingClientRect().height / parseFloat(getComputedStyle(li).lineHeight)),
          current: li.classList.contains('current')}};
}})()""")
shot("6-long-id")

# Opening another session from the sidebar puts it in the address.
js("[...document.querySelectorAll('li.session')].find(li => li.title === 'web').click(); true")
until("location.hash === '#/s/web' && $('current').textContent === 'web'", "sidebar-click")
out["sidebar_hash"] = js("location.hash")

# Approvals as before: a run that needs one ends waiting; approve streams the rest.
send("write it")
until("!!document.querySelector('#approvals button.approve') && !$('busy').classList.contains('on')",
      "approval-listed", timeout=20)
out["approval"] = {"note": js(f"{LOG_TEXT}.includes('Waiting for your decision')"),
                   "listed": js("$('approvals').innerText")}
shot("7-approval")
js("document.querySelector('#approvals button.approve').click(); true")
until(f"{LOG_TEXT}.includes('written') && !document.querySelector('#approvals button.approve') "
      "&& !$('busy').classList.contains('on')", "approved", timeout=20)
out["approved"] = js(f"{LOG_TEXT}.slice(-200)")
shot("8-approved")
print(json.dumps(out))
