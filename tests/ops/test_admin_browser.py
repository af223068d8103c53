"""The "Task locks" page in a real browser: its layout, and force-releasing another process's lock.

Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against pytest-django's live server, in a 1280 px wide window. The
layout is measured, not eyeballed: breadcrumbs with the markup and computed
style of the admin's own pages, the search bar above the table, every column
inside the window — on whichever Django is installed (CI runs it on the oldest
and the newest supported one). Screenshots, named after the Django version
(``admin-task-locks-django-6.1.png``), are written to the directory named by
``TASKLOCK_TEST_ARTIFACTS`` (default: a ``django-tasklock-artifacts`` directory
in the temporary directory); ``TASKLOCK_TEST_ARTIFACTS=docs`` refreshes the
pictures in ``docs/``. Without a browser the test skips, except under ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import django
import pytest
from django.contrib.auth.models import User

from django_tasklock.api.service import TaskLockService, new_token
from tests.conftest import database_backend
from tests.support import services
from tests.support.holder import hold_until_lost

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HELD_ELSEWHERE = "nightly-report:2026-11-30"
#: A limit=2 key whose permits the permit test holds.
LIMITED = "nightly-export"
WIDTH = 1280
DJANGO = f"django-{django.VERSION[0]}.{django.VERSION[1]}"
#: What makes breadcrumbs look like the admin's: compared with a page of Django's own.
BREADCRUMB_STYLE = (
    "display",
    "background-color",
    "color",
    "padding-left",
    "padding-top",
    "margin-top",
)


def artifacts_dir() -> Path:
    path = Path(
        os.environ.get("TASKLOCK_TEST_ARTIFACTS")
        or Path(tempfile.gettempdir()) / "django-tasklock-artifacts"
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser() -> Iterator[Any]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if importlib.util.find_spec("selenium") is None:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        reason = f"no browser: missing {', '.join(missing)}"
        if services.IN_CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument(f"--window-size={WIDTH},720")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def holder() -> Iterator[tuple[Connection, int]]:
    """Another process holding ``HELD_ELSEWHERE`` in the test database (an SQLite file)."""
    recipe = database_backend("default").recipe
    assert recipe is not None
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=hold_until_lost, args=(recipe, HELD_ELSEWHERE, theirs))
    proc.start()
    try:
        assert ours.poll(60), "the holder never reported"
        message, pid = ours.recv()
        assert message == "acquired"
        yield ours, pid
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def breadcrumbs(browser: Any) -> dict[str, Any]:
    """The page's breadcrumbs: their element, computed style and items (``items`` on the
    admin's own pages is left out of comparisons by overriding it)."""
    return browser.execute_script(  # type: ignore[no-any-return]
        """
        const crumbs = document.querySelector("nav .breadcrumbs");
        if (!crumbs) return {missing: true};
        const style = getComputedStyle(crumbs);
        const link = crumbs.querySelector("a");
        const items = crumbs.tagName === "OL"
            ? [...crumbs.children].map((li) => li.textContent.trim())
            : crumbs.textContent.split("\u203a").map((text) => text.trim());
        return {
            tag: crumbs.tagName,
            style: Object.fromEntries(arguments[0].map((name) => [name, style[name]])),
            link_color: link && getComputedStyle(link).color,
            items: items,
        };
        """,
        list(BREADCRUMB_STYLE),
    )


def assert_fits(browser: Any) -> None:
    """Search above the table, and every column inside the window."""
    layout = browser.execute_script(
        """
        const box = (el) => el.getBoundingClientRect();
        const toolbar = box(document.getElementById("toolbar"));
        const table = box(document.getElementById("result_list"));
        return {
            viewport: document.documentElement.clientWidth,
            toolbar: {bottom: toolbar.bottom, left: toolbar.left},
            table: {top: table.top, left: table.left},
            columns: [...document.querySelectorAll("#result_list thead th")].map(
                (th) => [th.textContent.trim(), box(th).right]),
        };
        """
    )
    assert layout["viewport"] <= WIDTH
    assert layout["toolbar"]["bottom"] <= layout["table"]["top"], layout
    assert abs(layout["toolbar"]["left"] - layout["table"]["left"]) < 2, layout
    outside = [name for name, right in layout["columns"] if right > layout["viewport"]]
    assert not outside, f"outside the {layout['viewport']} px window: {outside}: {layout}"


@pytest.mark.django_db(transaction=True)
def test_force_release_another_process_lock_in_the_browser(
    browser: Any, live_server: Any, holder: tuple[Connection, int]
) -> None:
    from selenium.webdriver.common.by import By

    conn, pid = holder
    User.objects.create_superuser("admin", password="admin")
    backend = TaskLockService().backend
    for key in ("rebuild-rollups", "community-pr:abc-123"):
        backend.acquire(
            key, new_token(), ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
        )

    browser.get(f"{live_server.url}/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.ID, "user-tools")  # logged in
    browser.get(f"{live_server.url}/admin/auth/user/")  # one of Django's own pages
    own = breadcrumbs(browser)
    browser.get(f"{live_server.url}/admin/")
    browser.find_element(By.CSS_SELECTOR, "tr.model-cacheentry th a").click()

    row = browser.find_element(By.XPATH, f"//tr[th/code[text()='{HELD_ELSEWHERE}']]")
    assert row.find_element(By.CLASS_NAME, "field-pid").text == str(pid)
    assert breadcrumbs(browser) == {**own, "items": ["Home", "Task locks"]}
    assert_fits(browser)
    browser.save_screenshot(str(artifacts_dir() / f"admin-task-locks-{DJANGO}.png"))

    row.find_element(By.LINK_TEXT, "Force release").click()
    assert HELD_ELSEWHERE in browser.find_element(By.ID, "content").text
    assert breadcrumbs(browser) == {
        **own,
        "items": ["Home", "Task locks", "Force release"],
    }
    browser.save_screenshot(str(artifacts_dir() / f"admin-task-locks-confirm-{DJANGO}.png"))
    browser.find_element(By.CSS_SELECTOR, "input[value='Yes, force-release it']").click()

    message = browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message.startswith(
        f"Released '{HELD_ELSEWHERE}' (was held by {socket.gethostname()}:{pid}, lease "
    )
    keys = [code.text for code in browser.find_elements(By.CSS_SELECTOR, "th.field-key code")]
    assert keys == ["community-pr:abc-123", "rebuild-rollups"]
    browser.save_screenshot(str(artifacts_dir() / f"admin-task-locks-released-{DJANGO}.png"))

    # The holder's heartbeat finds its lease gone: lock_lost, then result.lost.
    assert conn.poll(15), "the holder did not notice"
    assert conn.recv() == ("finished", True)


@pytest.mark.django_db(transaction=True)
def test_force_release_one_permit_in_the_browser(browser: Any, live_server: Any) -> None:
    from django.contrib.admin.models import LogEntry
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="admin")
    backend = TaskLockService().backend
    assert backend.capabilities.permits
    tokens = [f"worker-{n}.example:100{n}:secret-{n}" for n in range(2)]
    for token in tokens:
        assert backend.acquire_permit(
            LIMITED, token, limit=3, ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
        )
    backend.acquire(
        "rebuild-rollups", new_token(), ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
    )

    browser.get(f"{live_server.url}/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.ID, "user-tools")  # logged in
    browser.get(f"{live_server.url}/admin/django_tasklock/cacheentry/")

    def rows() -> list[list[str]]:
        return [
            [cell.text for cell in row.find_elements(By.CSS_SELECTOR, "th, td")][:3]
            for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        ]

    assert rows() == [
        [LIMITED, "2 of 3 permits held"],
        ["permit 0", "worker-0.example", "1000"],
        ["permit 1", "worker-1.example", "1001"],
        ["rebuild-rollups", socket.gethostname(), str(os.getpid())],
    ]
    assert "2 of 2 held (3 leases" in browser.find_element(By.ID, "toolbar").text
    assert_fits(browser)
    browser.save_screenshot(str(artifacts_dir() / f"admin-task-locks-permits-{DJANGO}.png"))

    permit = browser.find_element(By.XPATH, "//tr[th[normalize-space()='permit 1']]")
    assert permit.find_element(By.TAG_NAME, "th").get_attribute("title") == (
        f"permit 1 of {LIMITED}"
    )
    permit.find_element(By.LINK_TEXT, "Force release").click()
    content = browser.find_element(By.ID, "content").text
    assert f"Force-release permit 1 of the task lock {LIMITED}?" in content
    assert "worker-1.example" in content
    browser.find_element(By.CSS_SELECTOR, "input[value='Yes, force-release it']").click()

    message = browser.find_element(By.CSS_SELECTOR, ".messagelist .success").text
    assert message.startswith(
        f"Released permit 1 of '{LIMITED}' (was held by worker-1.example:1001, lease "
    )
    assert rows() == [
        [LIMITED, "1 of 3 permits held"],
        ["permit 0", "worker-0.example", "1000"],
        ["rebuild-rollups", socket.gethostname(), str(os.getpid())],
    ]
    assert backend.peek(f"{LIMITED}\x1f1") is None
    assert backend.peek(f"{LIMITED}\x1f0") is not None
    [entry] = LogEntry.objects.all()
    assert entry.object_repr == f"{LIMITED} (permit 1)"


@pytest.mark.django_db(transaction=True)
def test_keys_marked_to_run_once_more_in_the_browser(browser: Any, live_server: Any) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("admin", password="admin")
    backend = TaskLockService().backend
    assert backend.capabilities.rerun
    tokens = {key: new_token() for key in ("community-pr:abc-123", "rebuild-search-index")}
    for key, token in tokens.items():
        assert backend.acquire(
            key, token, ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
        )
    # A skipped on_locked="rerun" call marks the held key; a holder that raised left
    # the mark of "rebuild-rollups" on a key nobody holds.
    assert backend.mark_rerun("rebuild-search-index", "")
    rollups = new_token()
    assert backend.acquire(
        "rebuild-rollups", rollups, ttl=timedelta(minutes=15), max_lifetime=timedelta(hours=1)
    )
    assert backend.mark_rerun("rebuild-rollups", "")
    assert backend.release("rebuild-rollups", rollups)

    browser.get(f"{live_server.url}/admin/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("admin")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    browser.find_element(By.ID, "user-tools")  # logged in
    browser.get(f"{live_server.url}/admin/django_tasklock/cacheentry/")

    headers = browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")
    assert "Rerun" in [th.get_attribute("textContent").strip() for th in headers]
    marked = browser.find_element(By.XPATH, "//tr[th/code[text()='rebuild-search-index']]")
    when = marked.find_element(By.CSS_SELECTOR, "td.field-rerun .rerun-marked")
    assert when.text == "marked"
    title = when.get_attribute("title") or ""
    assert re.match(r"Marked to run once more since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", title)
    plain = browser.find_element(By.XPATH, "//tr[th/code[text()='community-pr:abc-123']]")
    assert plain.find_element(By.CSS_SELECTOR, "td.field-rerun").text == ""
    unheld = browser.find_element(By.XPATH, "//tr[th/code[text()='rebuild-rollups']]")
    assert unheld.find_element(By.CSS_SELECTOR, "td.field-not-held").text.startswith(
        "not held; marked to run once more (since "
    )
    assert unheld.find_elements(By.LINK_TEXT, "Force release") == []
    keys = [code.text for code in browser.find_elements(By.CSS_SELECTOR, "th.field-key code")]
    assert keys == ["community-pr:abc-123", "rebuild-rollups", "rebuild-search-index"]
    toolbar = browser.find_element(By.ID, "toolbar").text
    assert "2 of 2 held; 1 marked to run once more, not held" in toolbar
    assert_fits(browser)
    browser.save_screenshot(str(artifacts_dir() / f"admin-task-locks-rerun-{DJANGO}.png"))
