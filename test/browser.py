"""
Headless Chromium for the tests, driven over its DevTools protocol through a pipe
(--remote-debugging-pipe: JSON messages, each ending in a NUL byte; ours go to the browser's fd 3,
its replies and events come from its fd 4). One browser serves many pages, so a test can open
dev/memory.html hundreds of times in seconds: a launch a page (--dump-dom) costs 0.7 s each.

    browser = Browser("/usr/bin/chromium", profile_dir)
    html = browser.dom("file:///.../dev/memory.html?e=d12")   # the DOM once the page has loaded
    browser.close()
"""
import json
import os
import subprocess


class Browser:
    def __init__(self, chromium, profile):
        to_read, to_write = os.pipe()
        from_read, from_write = os.pipe()

        def child_fds():  # the pipe's ends at the browser's fds 3 and 4 (a dup2 onto itself keeps
            for fd, target in ((to_read, 3), (from_write, 4)):  # close-on-exec: cleared after)
                if fd != target:
                    os.dup2(fd, target)
                os.set_inheritable(target, True)
        self.proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--user-data-dir=" + profile, "--remote-debugging-pipe", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False,
                                     preexec_fn=child_fds)
        os.close(to_read)
        os.close(from_write)
        self.out, self.inp, self.buffer, self.next_id, self.events = os.fdopen(to_write, "wb"), from_read, b"", 0, []
        # the blank page it opened: attach to it, and hear its load events
        page = [t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page"][0]
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def message(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe (exit %s)" % self.proc.poll())
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method, session=False, **params):
        """a protocol command and its result (the events that arrive meanwhile are kept)"""
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.out.write(json.dumps(msg).encode() + b"\0")
        self.out.flush()
        while True:
            m = self.message()
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]
            self.events.append(m)

    def dom(self, url):
        """the page at url, its HTML once its load event has fired (its scripts have run)"""
        self.events = []
        self.call("Page.navigate", session=True, url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self.message())
        return self.call("Runtime.evaluate", session=True, expression="document.documentElement.outerHTML",
                         returnByValue=True)["result"]["value"]

    def close(self):
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        self.proc.wait(timeout=30)
        self.out.close()
        os.close(self.inp)
