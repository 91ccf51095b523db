"""Headless Chromium for the playground tests, driven by selenium: the system's Chromium and its chromedriver (the
Debian packages `chromium` and `chromium-driver`, README "Install"), so selenium-manager downloads nothing."""

import os
import shutil

import pytest

BINARIES = {"chromium": ("chromium", "chromium-browser", "google-chrome"), "chromedriver": ("chromedriver",)}


def find(kind: str) -> str:
    for name in BINARIES[kind]:
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    pytest.fail(f"no {kind} on PATH: the playground tests drive the system's Chromium (Debian/Ubuntu: "
                f"`apt-get install -y chromium chromium-driver`, README \"Install\")")


def headless_chromium(width: int = 1280, height: int = 900):
    """A selenium `webdriver.Chrome` on headless Chromium that keeps the page's console messages."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager: never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = find("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--disable-extensions", f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(find("chromedriver")))


def console_errors(driver) -> list[str]:
    """The page's console errors since the last call (uncaught exceptions, failed loads, console.error)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
