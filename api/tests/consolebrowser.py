"""Headless Chromium for the web console's tests: Debian's chromium driven
through Debian's chromedriver by Selenium (no browser download), with the
steps every test takes (sign in, submit a form, wait for the DOM) and
screenshots under out/console/<test>/ (git-ignored)."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
OUT = Path(__file__).resolve().parents[2] / "out" / "console"


class Browser:
    """One Chromium window on the console at `base`, saving screenshots of
    the test `name`."""

    def __init__(self, driver: Any, base: str, name: str) -> None:
        self.d, self.base = driver, base
        self.dir = OUT / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.shots: list[Path] = []

    def open(self, path: str) -> None:
        self.d.get(self.base + path)

    @property
    def path(self) -> str:
        url = str(self.d.current_url)
        return url.removeprefix(self.base)

    def shot(self, step: str) -> Path:
        p = self.dir / f"{len(self.shots) + 1:02d}-{step}.png"
        assert self.d.save_screenshot(str(p)), p
        assert p.stat().st_size > 1000, p
        self.shots.append(p)
        return p

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.d.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return list(self.d.find_elements(By.CSS_SELECTOR, css))

    def has(self, css: str) -> bool:
        return bool(self.all(css))

    def text(self, css: str) -> str:
        return str(self.find(css).text)

    def wait(self, cond: Callable[[], Any], timeout: float, what: str,
             every: float = 0.25) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                v = cond()
            except Exception:  # noqa: BLE001  the DOM is being swapped: look again
                v = None
            if v:
                return v
            if time.monotonic() > deadline:
                self.shot("timeout")
                raise AssertionError(f"timed out after {timeout}s waiting for {what} "
                                     f"at {self.path}")
            time.sleep(every)

    def submit(self, css: str, timeout: float = 30) -> None:
        """Click `css` and wait for the next document (a form's answer)."""
        self.d.execute_script("window.__before_submit = true")
        self.find(css).click()
        self.wait(lambda: not self.d.execute_script("return window.__before_submit === true"),
                  timeout, f"the page after clicking {css}")

    def sign_in(self, token: str) -> None:
        """Through the sign-in form, as an operator would (the one shown, or
        a fresh one)."""
        if not self.has("#login-form"):
            self.open("/console/login")
        self.find("#token").send_keys(token)
        self.submit("#login-submit")

    def csrf(self) -> str:
        """The session's CSRF token, as the page's own forms carry it."""
        return str(self.find("input[name=csrf]").get_attribute("value"))

    def forge_post(self, path: str, fields: dict[str, str]) -> None:
        """Submit a form the page does not offer (what a user could craft):
        the server, not the page, must refuse it."""
        self.d.execute_script(
            "const f = document.createElement('form'); f.method = 'post';"
            "f.action = arguments[0];"
            "for (const [k, v] of Object.entries(arguments[1])) {"
            "  const i = document.createElement('input'); i.type = 'hidden';"
            "  i.name = k; i.value = v; f.appendChild(i); }"
            "document.body.appendChild(f); window.__before_submit = true; f.submit();",
            path, fields)
        self.wait(lambda: not self.d.execute_script("return window.__before_submit === true"),
                  30, f"the answer to POST {path}")

    def refusal(self) -> tuple[int, str]:
        """The (status, code) of the refusal page now shown."""
        el = self.wait(lambda: self.find("#error"), 15, "a refusal page")
        return int(el.get_attribute("data-status")), str(el.get_attribute("data-code"))


def start_chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    # Root on a 2-core machine without a display: no sandbox (root), no GPU,
    # /tmp instead of a small /dev/shm.
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1360,1000", "--lang=en-US"):
        opts.add_argument(a)
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))


@contextmanager
def browser(base: str, name: str) -> Iterator[Browser]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are missing: run `make setup`")
    driver = start_chromium()
    try:
        yield Browser(driver, base, name)
    finally:
        driver.quit()
