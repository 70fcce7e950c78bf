"""report.html as a person sees it: loaded in headless Chromium, checked, and photographed."""

from __future__ import annotations

import base64
import fcntl
import html.parser
import json
import os
import re
import select
import shutil
import signal
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = "install Debian's chromium: apt-get install -y chromium"
# Headless, no sandbox (CI runs as root), nothing fetched on the browser's own account, and no
# host name resolves: a page that tries to load anything from outside fails here, visibly.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-pipe",
)  # fmt: skip
# Attributes that make a browser fetch (or navigate to) a URL, and CSS that does.
URL_ATTRIBUTES = {"src", "href", "poster", "data", "action", "formaction", "background"}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""", re.IGNORECASE)

# Runs in the page after load: decode every image, and report what a person would see.
PROBE = """
(async () => {
  const imgs = Array.from(document.images);
  const decodeErrors = await Promise.all(imgs.map(
    (img) => img.decode().then(() => null, (e) => String(e))));
  const shown = (el) => {
    if (!el) return {present: false, visible: false, text: ""};
    const r = el.getBoundingClientRect();
    const visible = r.width > 0 && r.height > 0 &&
      el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true});
    return {present: true, visible: visible, text: el.textContent.trim().slice(0, 300)};
  };
  const failures = Array.from(document.querySelectorAll("h2"))
    .find((h) => h.textContent.trim().startsWith("Failures"));
  return {
    title: document.title,
    images: imgs.map((img, i) => ({
      alt: img.alt, src: img.getAttribute("src").slice(0, 60), complete: img.complete,
      naturalWidth: img.naturalWidth, naturalHeight: img.naturalHeight,
      width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height,
      decodeError: decodeErrors[i],
    })),
    verdict: shown(document.querySelector(".verdict")),
    verdictColours: (() => {
      const el = document.querySelector(".verdict");
      if (!el) return null;
      const style = getComputedStyle(el);
      return {background: style.backgroundColor, color: style.color};
    })(),
    failures: shown(failures),
    failureEntries: failures ? document.querySelectorAll("h2 ~ h3").length : 0,
  };
})()
"""


def greenish(css_colour: str) -> bool:
    """Whether a computed CSS colour ('rgb(216, 240, 216)') reads as green: its green channel
    well above red and blue, and the colour not transparent."""
    m = re.fullmatch(r"rgba?\((\d+), (\d+), (\d+)(?:, ([\d.]+))?\)", css_colour.strip())
    if not m or (m[4] is not None and float(m[4]) == 0):
        return False
    r, g, b = int(m[1]), int(m[2]), int(m[3])
    return g >= r + 16 and g >= b + 16


class BrowserError(RuntimeError):
    """Chromium could not be started or did not answer."""


def find_chromium() -> str | None:
    """The Chromium executable: $TE_CHROMIUM if set (None when that is not an executable),
    else the first of CHROMIUM_NAMES on PATH."""
    explicit = os.environ.get("TE_CHROMIUM")
    if explicit:
        return shutil.which(explicit)
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


class _ResourceURLs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self._in_style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if name == "srcset":  # "url 1x, url 2x"
                self.urls += [part.split()[0] for part in value.split(",") if part.strip()]
            elif name in URL_ATTRIBUTES:
                self.urls.append(value.strip())
            elif name == "style":
                self.urls += _css_urls(value)

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.urls += _css_urls(data)


def _css_urls(css: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(css)]


def external_references(page: str) -> list[str]:
    """URLs in the page that a browser would fetch or open, other than data: URIs and #anchors
    (the file must be self-contained: it is read offline, attached to CI runs, mailed)."""
    parser = _ResourceURLs()
    parser.feed(page)
    return [u for u in parser.urls if u and not u.startswith(("data:", "#"))]


@dataclass
class PageCheck:
    """What loading one page showed."""

    url: str
    console_errors: list[str] = field(default_factory=list)  # console.error, exceptions, errors
    requests: list[str] = field(default_factory=list)  # URLs requested besides the page itself
    static_urls: list[str] = field(default_factory=list)  # external_references() of the file
    probe: dict = field(default_factory=dict)  # PROBE's answer
    screenshot: bytes = b""

    def problems(self, expect_failures: bool | None = None) -> list[str]:
        """Everything a person would find wrong, one line each (empty: the page is fine).
        ``expect_failures``: whether the report has failing cases (their section must show);
        None: a failure section must show if it exists."""
        out = [f"console error: {m}" for m in self.console_errors]
        out += [f"external URL in the file: {u}" for u in self.static_urls]
        out += [f"request beyond the file: {u}" for u in self.requests]
        for img in self.probe.get("images", []):
            name = f"image '{img['alt']}' ({img['src']}...)"
            if img["decodeError"]:
                out.append(f"{name} did not decode: {img['decodeError']}")
            elif not (img["complete"] and img["naturalWidth"] > 0 and img["naturalHeight"] > 0):
                out.append(f"{name} has no pixels ({img['naturalWidth']}x{img['naturalHeight']})")
            if not (img["width"] > 0 and img["height"] > 0):
                out.append(f"{name} takes no space on the page ({img['width']}x{img['height']})")
        verdict = self.probe.get("verdict", {})
        if not verdict.get("visible"):
            out.append("the verdict banner (.verdict) is not visible")
        colours = self.probe.get("verdictColours") or {}
        if re.search(r"\bFAIL\b", verdict.get("text", "")) and any(
            greenish(colours.get(k, "")) for k in ("background", "color")
        ):
            out.append(f"a FAIL verdict is shown green ({colours})")
        failures = self.probe.get("failures", {})
        want = failures.get("present") if expect_failures is None else expect_failures
        if want and not failures.get("visible"):
            out.append("the failure section is not visible")
        if want and not self.probe.get("failureEntries"):
            out.append("the failure section lists no failure")
        if expect_failures is False and failures.get("present"):
            out.append("a failure section is shown, but the report has no failing case")
        return out


class Chromium:
    """A headless Chromium for checking pages; ``with Chromium() as browser: browser.check(p)``.

    Driven over the DevTools protocol on a pipe (--remote-debugging-pipe: commands on file
    descriptor 3, replies and events on 4, JSON messages ended by a NUL byte): nothing beyond the
    standard library and Debian's chromium package, and no port opened.
    """

    def __init__(self, executable: str | None = None, timeout: float = 60.0):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError(f"Chromium not found ({INSTALL_HINT})")
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict] = []

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="te-chromium-")
        self._log = open(Path(self._profile.name) / "chromium.log", "w+b")  # noqa: SIM115
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # DevTools reads fd 3 and writes fd 4. posix_spawn (no Python code between fork and
        # exec) dup2s copies placed at >= 10, so that no step overwrites a descriptor still to
        # be moved; the copies are close-on-exec, the dup2 targets are inherited.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser_r, from_browser_w)]
        argv = [self.executable, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"]
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, self._log.fileno(), 1),
            (os.POSIX_SPAWN_DUP2, self._log.fileno(), 2),
            (os.POSIX_SPAWN_DUP2, high[0], 3),
            (os.POSIX_SPAWN_DUP2, high[1], 4),
        ]
        try:
            self._pid = os.posix_spawn(self.executable, argv, os.environ, file_actions=actions)
        except OSError as e:
            raise BrowserError(f"cannot start {self.executable}: {e}") from None
        finally:
            for fd in (to_browser_r, from_browser_w, *high):
                os.close(fd)
        try:
            self.send("Browser.getVersion")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _exited(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            pid, _ = os.waitpid(self._pid, os.WNOHANG)
            if pid:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        try:
            if not self._exited(0):
                try:
                    self.send("Browser.close", timeout=10)
                except BrowserError:
                    pass
                if not self._exited(10):
                    os.kill(self._pid, signal.SIGKILL)
                    os.waitpid(self._pid, 0)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._log.close()
            self._profile.cleanup()

    # ------------------------------------------------------------------ the protocol

    def _log_tail(self) -> str:
        self._log.flush()
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-15:])

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"Chromium did not answer in time; its log:\n{self._log_tail()}")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited; its log:\n{self._log_tail()}")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:  # fmt: skip
        """One DevTools command; its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._to_browser, data) :]
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _wait_for(self, method: str, session: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        seen = 0
        while True:
            for event in self._events[seen:]:
                if event["method"] == method and event.get("sessionId") == session:
                    return event
            seen = len(self._events)
            message = self._read_message(deadline)
            if "method" in message:
                self._events.append(message)

    # ------------------------------------------------------------------ one page

    def check(self, page: str | Path, width: int = 1280, height: int = 1000,
              full_page: bool = True) -> PageCheck:  # fmt: skip
        """Load a local HTML file, run PROBE, take a PNG screenshot (the whole page, or the
        first ``height`` pixels), and collect console errors and requests beyond the file."""
        path = Path(page).resolve()
        url = path.as_uri()
        result = PageCheck(url=url, static_urls=external_references(path.read_text("utf-8")))
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        first_event = len(self._events)
        try:
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable", session=session)
            self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                      "deviceScaleFactor": 1, "mobile": False}, session)  # fmt: skip
            nav = self.send("Page.navigate", {"url": url}, session)
            if nav.get("errorText"):
                raise BrowserError(f"cannot open {url}: {nav['errorText']}")
            self._wait_for("Page.loadEventFired", session)
            answer = self.send("Runtime.evaluate", {"expression": PROBE, "awaitPromise": True,
                               "returnByValue": True}, session)  # fmt: skip
            if "exceptionDetails" in answer:
                raise BrowserError(f"the page probe failed: {answer['exceptionDetails']}")
            result.probe = answer["result"]["value"]
            shot: dict = {"format": "png"}
            if full_page:
                size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
                shot.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "scale": 1,
                            "width": width, "height": max(1, int(size["height"]))})  # fmt: skip
            data = self.send("Page.captureScreenshot", shot, session)["data"]
            result.screenshot = base64.b64decode(data)
        finally:
            self.send("Target.closeTarget", {"targetId": target})
        events = [e for e in self._events[first_event:] if e.get("sessionId") == session]
        for e in events:
            p = e["params"]
            if e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                result.console_errors.append(f"console.{p['type']}: {text}")
            elif e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                result.console_errors.append(
                    f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}"
                )
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                entry = p["entry"]
                result.console_errors.append(f"{entry['source']}: {entry['text']}")
            elif e["method"] == "Network.requestWillBeSent":
                requested = p["request"]["url"]
                if requested != url and not requested.startswith("data:"):
                    result.requests.append(requested)
        return result


PNG_KEY = b"te-conformance-report"  # the tEXt chunk saying which report a screenshot shows


def tag_png(png: bytes, info: dict, key: bytes = PNG_KEY) -> bytes:
    """The PNG with a tEXt chunk (``key``) holding ``info`` as JSON, before IEND."""
    body = b"tEXt" + key + b"\0" + json.dumps(info, sort_keys=True).encode("latin-1")
    chunk = len(body[4:]).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
    end = png.rindex(b"IEND") - 4
    return png[:end] + chunk + png[end:]


def png_tag(png: bytes, key: bytes = PNG_KEY) -> dict | None:
    """What tag_png() stored in a PNG under ``key`` (None when it holds no such chunk)."""
    pos = 8
    while pos + 8 <= len(png):
        length, kind = int.from_bytes(png[pos : pos + 4], "big"), png[pos + 4 : pos + 8]
        data = png[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and data.startswith(key + b"\0"):
            return json.loads(data[len(key) + 1 :].decode("latin-1"))
        pos += 12 + length
    return None


def check_page(page: str | Path, screenshot: str | Path | None = None, **kwargs) -> PageCheck:
    """Chromium().check(page) in a browser of its own; writes the screenshot if asked."""
    with Chromium() as browser:
        result = browser.check(page, **kwargs)
    if screenshot:
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        Path(screenshot).write_bytes(result.screenshot)
    return result
