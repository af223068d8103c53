"""The "Task locks" admin page: listing, searching, force release, permissions."""

from __future__ import annotations

import dataclasses
import html as htmllib
import io
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.utils.html import escape

from django_tasklock.api.service import TaskLockService, new_token
from django_tasklock.backends.base import BaseBackend, HeldLock, permit_key
from django_tasklock.models import CacheEntry
from django_tasklock.testing import ContractBackend

LIST_URL = "/admin/django_tasklock/cacheentry/"
RELEASE_URL = "/admin/django_tasklock/cacheentry/release/"
TOKEN = "worker-7.example:4242:SECRET-PART-OF-THE-TOKEN"

pytestmark = pytest.mark.databases


def hold(backend: BaseBackend, key: str, token: str = TOKEN) -> None:
    assert backend.acquire(key, token, ttl=timedelta(minutes=5), max_lifetime=timedelta(hours=1))


def make_user(username: str, *perms: str, superuser: bool = False) -> User:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.is_superuser = superuser
    user.save()
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def client_for(user: User | None, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def admin_client_() -> Client:
    return client_for(make_user("root", superuser=True))


def texts(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def form_fields(response: Any) -> dict[str, str]:
    """The hidden fields the confirmation page's form posts."""
    found = re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)"', response.content.decode()
    )
    return {name: htmllib.unescape(value) for name, value in found}


def release_link(response: Any, key: str) -> str:
    """The "Force release" link of ``key``'s row on the list page."""
    for href in re.findall(r'<a class="deletelink" href="([^"]+)"', response.content.decode()):
        if f"key={key}" in htmllib.unescape(href):
            return htmllib.unescape(href)
    raise AssertionError(f"no release link for {key}")


# -- on every backend ---------------------------------------------------------------


def test_superuser_lists_searches_and_force_releases(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    hold(backend, f"{key}:rollups")
    hold(backend, f"{key}:community-pr", new_token())
    root = make_user("root", superuser=True)
    client = client_for(root)

    page = client.get(LIST_URL, {"q": key.upper()})
    assert page.status_code == 200
    html = page.content.decode()
    assert f"<code>{key}:rollups</code>" in html
    assert f"<code>{key}:community-pr</code>" in html
    assert "worker-7.example" in html
    assert "4242" in html
    assert re.search(r"[45] min \d\d s", html)
    assert "SECRET-PART" not in html
    assert f"?key={key}%3Arollups" in html  # the force-release link

    only = client.get(LIST_URL, {"q": f"{key}:roll"}).content.decode()
    assert f"{key}:rollups" in only
    assert f"{key}:community-pr" not in only

    confirm = client.get(RELEASE_URL, {"key": f"{key}:rollups"})
    assert confirm.status_code == 200
    assert "Force-release the task lock" in confirm.content.decode()
    assert "SECRET-PART" not in confirm.content.decode()
    assert backend.peek(f"{key}:rollups") is not None  # GET changes nothing

    fields = form_fields(confirm)
    shown = backend.peek(f"{key}:rollups")
    assert shown is not None
    assert fields["lease"] == shown.lease
    done = client.post(RELEASE_URL, fields, follow=True)
    assert done.redirect_chain == [(LIST_URL, 302)]
    assert texts(done) == [
        f"Released '{key}:rollups' (was held by worker-7.example:4242, lease {shown.lease})."
    ]
    assert backend.peek(f"{key}:rollups") is None
    assert backend.peek(f"{key}:community-pr") is not None

    [entry] = LogEntry.objects.all()
    assert entry.user == root
    assert entry.action_flag == DELETION
    assert entry.content_type == ContentType.objects.get_for_model(CacheEntry)
    assert entry.object_repr == f"{key}:rollups"
    assert entry.object_id == f"task-lock:{key}:rollups"
    assert "worker-7.example:4242" in entry.change_message


def test_a_holder_whose_process_is_gone_is_marked(
    active_backend: ContractBackend, key: str
) -> None:
    from django_tasklock.processes import this_machine
    from django_tasklock.testing.cases_dead import dead_token

    if this_machine() is None:
        pytest.skip("no /proc here: no holder can be proven gone")
    hold(active_backend.backend, f"{key}:dead", dead_token())
    hold(active_backend.backend, f"{key}:live", new_token())
    html = client_for(make_user("root", superuser=True)).get(LIST_URL, {"q": key})
    rows = re.findall(r'<tr class="task-lock">(.*?)</tr>', html.content.decode(), re.DOTALL)
    marked = [row for row in rows if "(holder process gone)" in row]
    assert len(rows) == 2
    assert len(marked) == 1
    assert f"<code>{key}:dead</code>" in marked[0]


def test_the_page_shows_how_long_each_lock_has_been_held(
    active_backend: ContractBackend, key: str
) -> None:
    plant = active_backend.plant
    assert plant is not None
    plant(f"task-lock:{key}", TOKEN, timedelta(minutes=10), timedelta(minutes=5))
    html = client_for(make_user("root", superuser=True)).get(LIST_URL).content.decode()
    assert "<span>Held for</span>" in html
    assert re.search(r'<td class="field-held">(9|10) min \d\d s</td>', html)
    assert re.search(r'<td class="field-left">[45] min \d\d s</td>', html)


def test_keys_are_escaped_everywhere(active_backend: ContractBackend, key: str) -> None:
    evil = f"{key}<script>alert(1)</script>"
    hold(active_backend.backend, evil)
    client = client_for(make_user("root", superuser=True))
    escaped = f"{key}&lt;script&gt;alert(1)&lt;/script&gt;"

    confirm = client.get(RELEASE_URL, {"key": evil})
    for response in (
        client.get(LIST_URL),
        confirm,
        client.post(RELEASE_URL, form_fields(confirm), follow=True),
    ):
        html = response.content.decode()
        assert "<script>alert(1)" not in html
        assert escaped in html
    assert active_backend.backend.peek(evil) is None


def test_staff_without_the_permission_sees_the_list_only(
    active_backend: ContractBackend, key: str
) -> None:
    hold(active_backend.backend, key)
    client = client_for(make_user("viewer", "view_cacheentry"))

    page = client.get(LIST_URL)
    assert page.status_code == 200
    assert f"<code>{key}</code>" in page.content.decode()
    assert "Force release" not in page.content.decode()
    assert client.get(RELEASE_URL, {"key": key}).status_code == 403
    assert client.post(RELEASE_URL, {"key": key}).status_code == 403
    assert active_backend.backend.peek(key) is not None
    assert not LogEntry.objects.exists()


def test_release_confirms_the_lease_shown_not_its_successor(
    active_backend: ContractBackend, key: str
) -> None:
    # The page shows X; X finishes and Y takes the key; the operator confirms.
    backend = active_backend.backend
    hold(backend, key, "worker-x.example:1111:secret-x")
    client = client_for(make_user("root", superuser=True))
    confirm = client.get(RELEASE_URL, {"key": key})
    assert "worker-x.example" in confirm.content.decode()
    fields = form_fields(confirm)
    assert "secret-x" not in confirm.content.decode()
    assert backend.release(key, "worker-x.example:1111:secret-x")
    hold(backend, key, "worker-y.example:2222:secret-y")

    done = client.post(RELEASE_URL, fields, follow=True)

    now = backend.peek(key)
    assert now is not None
    assert now.holder.host == "worker-y.example"  # Y still holds it
    [message] = texts(done)
    assert "changed hands" in message
    assert "worker-y.example:2222" in message
    assert "Nothing was released" in message
    assert not LogEntry.objects.exists()


def test_a_release_link_from_an_old_page_names_the_change(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    hold(backend, key, "worker-x.example:1111:secret-x")
    client = client_for(make_user("root", superuser=True))
    link = release_link(client.get(LIST_URL), key)
    assert backend.release(key, "worker-x.example:1111:secret-x")
    hold(backend, key, "worker-y.example:2222:secret-y")

    response = client.get(link, follow=True)

    assert response.redirect_chain == [(LIST_URL, 302)]
    [message] = texts(response)
    assert "changed hands" in message
    assert "worker-y.example:2222" in message
    assert backend.peek(key) is not None


def test_a_lease_that_ended_before_the_confirmation(
    active_backend: ContractBackend, key: str
) -> None:
    backend = active_backend.backend
    hold(backend, key)
    client = client_for(make_user("root", superuser=True))
    fields = form_fields(client.get(RELEASE_URL, {"key": key}))
    assert backend.release(key, TOKEN)

    done = client.post(RELEASE_URL, fields, follow=True)

    assert texts(done) == [f"{key!r} is not held (any more): nothing to release."]
    assert not LogEntry.objects.exists()


# -- the rest on one backend --------------------------------------------------------


@pytest.fixture
def memory() -> Iterator[BaseBackend]:
    with override_settings(TASKLOCK_BACKEND="memory"):
        yield TaskLockService().backend


def test_anonymous_users_are_sent_to_log_in(memory: BaseBackend) -> None:
    for response in (Client().get(LIST_URL), Client().post(RELEASE_URL, {"key": "k"})):
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


def test_staff_without_any_permission_of_the_app_gets_403(memory: BaseBackend) -> None:
    client = client_for(make_user("staff"))
    assert client.get(LIST_URL).status_code == 403
    assert "Task locks" not in client.get("/admin/").content.decode()


def test_the_permission_alone_lets_staff_release(memory: BaseBackend, key: str) -> None:
    hold(memory, key)
    client = client_for(make_user("operator", "force_release"))
    assert "Force release" in client.get(LIST_URL).content.decode()
    fields = form_fields(client.get(RELEASE_URL, {"key": key}))
    assert client.post(RELEASE_URL, fields).status_code == 302
    assert memory.peek(key) is None


def test_the_admin_index_links_to_the_page(memory: BaseBackend, admin_client_: Client) -> None:
    html = admin_client_.get("/admin/").content.decode()
    assert "Task locks" in html
    assert f'href="{LIST_URL}"' in html
    assert reverse("admin:django_tasklock_cacheentry_changelist") == LIST_URL


def test_the_admin_index_names_the_model_task_locks(
    memory: BaseBackend, admin_client_: Client
) -> None:
    html = admin_client_.get("/admin/").content.decode()
    row = re.search(r'<tr class="model-cacheentry[^"]*">.*?</th>', html, re.DOTALL)
    assert row is not None
    link = re.search(rf'<a href="{LIST_URL}"[^>]*>([^<]+)</a>', row.group(0))
    assert link is not None
    assert link.group(1) == "Task locks"
    assert "Cache entries" not in html
    # The permission codenames stay: groups and users keep what they were granted.
    assert Permission.objects.filter(codename="force_release").exists()
    assert Permission.objects.filter(codename="view_cacheentry").exists()


def test_the_migrations_match_the_models() -> None:
    out = io.StringIO()
    call_command("makemigrations", "django_tasklock", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_breadcrumbs_use_the_admins_own_markup(
    memory: BaseBackend, admin_client_: Client, key: str
) -> None:
    hold(memory, key)
    own = admin_client_.get("/admin/auth/user/").content.decode()
    tag = "ol" if '<ol class="breadcrumbs">' in own else "div"
    assert f'<{tag} class="breadcrumbs">' in own
    for page in (admin_client_.get(LIST_URL), admin_client_.get(RELEASE_URL, {"key": key})):
        html = page.content.decode()
        assert f'<{tag} class="breadcrumbs">' in html
        # "Home > Task locks": the app's crumb says what the page's says, once.
        crumbs = html.split(f'<{tag} class="breadcrumbs">', 1)[1].split(f"</{tag}>", 1)[0]
        assert crumbs.count("Task locks") == 1, crumbs


def test_the_pages_speak_to_operators(
    memory: BaseBackend, admin_client_: Client, key: str
) -> None:
    """No class names, signal names or attributes: where the locks are, and what the
    holder does after a release, in words."""
    hold(memory, key)
    listing = admin_client_.get(LIST_URL).content.decode()
    assert "Locks held now in this process&#x27;s memory" in listing
    assert "MemoryBackend" not in listing
    confirm = admin_client_.get(RELEASE_URL, {"key": key}).content.decode()
    for jargon in ("lock_lost", "result.lost", "refresh"):
        assert jargon not in confirm
    assert "only then does it learn that it lost the" in confirm


def test_no_adding_or_changing_rows(memory: BaseBackend, admin_client_: Client) -> None:
    html = admin_client_.get("/admin/").content.decode()
    assert "/admin/django_tasklock/cacheentry/add/" not in html
    assert admin_client_.get(LIST_URL + "add/").status_code == 404
    assert admin_client_.get(LIST_URL + "task-lock:k/change/").status_code == 404


def test_release_needs_csrf(memory: BaseBackend, key: str) -> None:
    hold(memory, key)
    client = client_for(make_user("root", superuser=True), enforce_csrf_checks=True)

    assert client.post(RELEASE_URL, {"key": key}).status_code == 403
    assert memory.peek(key) is not None

    confirm = client.get(RELEASE_URL, {"key": key})
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', confirm.content.decode())
    assert token
    response = client.post(RELEASE_URL, form_fields(confirm))
    assert response.status_code == 302
    assert memory.peek(key) is None


@pytest.mark.parametrize("method", ["get", "post"])
def test_releasing_a_key_nobody_holds(
    memory: BaseBackend, admin_client_: Client, key: str, method: str
) -> None:
    response = getattr(admin_client_, method)(
        RELEASE_URL, {"key": key, "lease": "0123456789ab"}, follow=True
    )
    assert texts(response) == [f"'{key}' is not held (any more): nothing to release."]
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("key", "message"), [("", "key must not be empty"), ("x" * 246, "at most 245 characters")]
)
def test_releasing_a_bad_key(
    memory: BaseBackend, admin_client_: Client, key: str, message: str
) -> None:
    response = admin_client_.post(RELEASE_URL, {"key": key}, follow=True)
    assert message in texts(response)[0]


def test_a_post_that_names_no_lease_releases_nothing(
    memory: BaseBackend, admin_client_: Client, key: str
) -> None:
    hold(memory, key)
    response = admin_client_.post(RELEASE_URL, {"key": key}, follow=True)
    assert texts(response) == ["Cannot release: the form named no lease; reload the page."]
    assert memory.peek(key) is not None


def test_other_methods_are_refused(memory: BaseBackend, admin_client_: Client) -> None:
    assert admin_client_.put(RELEASE_URL).status_code == 405


def test_search_that_matches_nothing(memory: BaseBackend, admin_client_: Client) -> None:
    hold(memory, "rollups")
    html = admin_client_.get(LIST_URL, {"q": "<b>nothing</b>"}).content.decode()
    assert "No held lock matches “&lt;b&gt;nothing&lt;/b&gt;”." in html
    assert "0 of 1 held" in html


def test_no_locks_held(memory: BaseBackend, admin_client_: Client) -> None:
    assert "No locks held." in admin_client_.get(LIST_URL).content.decode()


def test_fences_are_shown_when_the_backend_has_them(
    memory: BaseBackend, admin_client_: Client, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    @dataclasses.dataclass(frozen=True)
    class FencedLock(HeldLock):
        fence: int = 0

    hold(memory, key)
    [plain] = memory.list()
    fields = {field.name: getattr(plain, field.name) for field in dataclasses.fields(plain)}
    monkeypatch.setattr(memory, "list", lambda: [FencedLock(**fields, fence=17)])
    html = admin_client_.get(LIST_URL).content.decode()
    assert "<span>Fence</span>" in html
    assert '<td class="field-fence">17</td>' in html


def test_marks_are_read_once_for_the_page_and_searched(
    memory: BaseBackend, admin_client_: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("rollups-a", "rollups-b", "search-index"):
        hold(memory, key, new_token())
        assert memory.mark_rerun(key, "")
    calls = []
    marks = memory.rerun_marks

    def counted(key: str | None = None) -> Any:
        calls.append(key)
        return marks(key)

    monkeypatch.setattr(memory, "rerun_marks", counted)
    html = admin_client_.get(LIST_URL).content.decode()
    assert calls == [None]
    assert html.count('<span class="rerun-marked"') == 3
    html = admin_client_.get(LIST_URL, {"q": "ROLLUPS"}).content.decode()
    assert html.count('<span class="rerun-marked"') == 2
    assert "search-index" not in html


def test_a_marked_key_nobody_holds_is_a_line_without_release(
    memory: BaseBackend, admin_client_: Client
) -> None:
    token = new_token()
    hold(memory, "rollups", token)
    assert memory.mark_rerun("rollups", "")
    assert memory.release("rollups", token)
    html = admin_client_.get(LIST_URL).content.decode()
    assert "No locks held." not in html
    assert re.search(
        r'<td class="field-not-held" colspan="7">not held; marked to run once more \(since ', html
    )
    assert "<span>Rerun</span>" not in html  # no key held is marked
    assert "deletelink" not in html
    assert "0 of 0 held; 1 marked to run once more, not held" in html
    assert "No held lock matches" in admin_client_.get(LIST_URL, {"q": "other"}).content.decode()


def test_no_marks_without_the_capability(
    memory: BaseBackend, admin_client_: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold(memory, "rollups")
    assert memory.mark_rerun("rollups", "")
    no_rerun = dataclasses.replace(memory.capabilities, rerun=False)
    monkeypatch.setattr(memory, "capabilities", no_rerun)
    monkeypatch.setattr(memory, "rerun_marks", None)  # never asked
    html = admin_client_.get(LIST_URL).content.decode()
    assert "<span>Rerun</span>" not in html
    assert "rerun-marked" not in html


def test_an_unreachable_backend_is_shown_not_a_500(admin_client_: Client) -> None:
    with override_settings(TASKLOCK_BACKEND="redis", TASKLOCK_REDIS_URL="redis://127.0.0.1:1/0"):
        page = admin_client_.get(LIST_URL)
        assert page.status_code == 200
        assert "The lock backend failed: ConnectionError" in page.content.decode()
        released = admin_client_.post(RELEASE_URL, {"key": "k", "lease": "x"}, follow=True)
        assert texts(released)[0].startswith("The lock backend failed: ConnectionError")


# -- permits (limit=N): one key, several leases -------------------------------------


@pytest.fixture
def permits(active_backend: ContractBackend) -> BaseBackend:
    """The active backend, if it gives permits."""
    assert active_backend.backend.capabilities.permits  # every backend gives permits
    return active_backend.backend


def two_of_three(backend: BaseBackend, key: str) -> list[str]:
    """Permits 0 and 2 of ``key`` held (limit 3), by ``worker-0`` and ``worker-2``."""
    tokens = [f"worker-{n}.example:100{n}:secret-{n}" for n in range(3)]
    for token in tokens:
        assert backend.acquire_permit(
            key, token, limit=3, ttl=timedelta(minutes=5), max_lifetime=timedelta(hours=1)
        )
    assert backend.release(permit_key(key, 1), tokens[1])
    return tokens


def release_links(response: Any) -> list[dict[str, str]]:
    """The query of each "Force release" link of the list page, in the page's order."""
    links = re.findall(r'<a class="deletelink" href="([^"]+)"', response.content.decode())
    return [dict(parse_qsl(urlsplit(htmllib.unescape(link)).query)) for link in links]


def cells(row: str) -> list[str]:
    """The text of a table row's cells, markup removed, entities decoded."""
    found = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.DOTALL)
    return [htmllib.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in found]


def test_permits_are_listed_under_their_key_and_one_is_released(
    permits: BaseBackend, key: str
) -> None:
    limited = f'{key}:<i>"rep&orts"</i>'  # escaped everywhere
    two_of_three(permits, limited)
    hold(permits, f"{key}:a")
    root = make_user("root", superuser=True)
    client = client_for(root)
    shown = permits.peek(permit_key(limited, 2))
    assert shown is not None

    page = client.get(LIST_URL, {"q": key})

    html = page.content.decode()
    assert "<i>" not in html
    assert "\x1f" not in html
    assert "%1f" not in html.lower()
    rows = re.findall(r'<tr class="(task-lock[^"]*)">(.*?)</tr>', html, re.DOTALL)
    assert [(kind, cells(row)[:3]) for kind, row in rows] == [
        ("task-lock-permits", [limited, "2 of 3 permits held"]),
        ("task-lock task-lock-permit", ["permit 0", "worker-0.example", "1000"]),
        ("task-lock task-lock-permit", ["permit 2", "worker-2.example", "1002"]),
        ("task-lock", [f"{key}:a", "worker-7.example", "4242"]),  # "<" sorts before "a"
    ]
    assert f"<code>{escape(limited)}</code>" in html
    assert "2 of 2 held (3 leases: a key held as permits counts once)" in html
    links = release_links(page)
    assert links[1] == {"key": limited, "permit": "2", "lease": shown.lease}
    assert "permit" not in links[2]

    confirm = client.get(RELEASE_URL, links[1])
    text = htmllib.unescape(re.sub(r"<[^>]+>", "", confirm.content.decode()))
    assert f"Force-release permit 2 of the task lock {limited}?" in text
    assert "Its other permits stay held." in text
    assert "worker-2.example" in text
    assert "secret-2" not in text
    assert "<i>" not in confirm.content.decode()
    assert permits.peek(permit_key(limited, 2)) is not None  # GET changes nothing
    fields = form_fields(confirm)
    assert (fields["key"], fields["permit"], fields["lease"]) == (limited, "2", shown.lease)

    done = client.post(RELEASE_URL, fields, follow=True)

    assert done.redirect_chain == [(LIST_URL, 302)]
    assert texts(done) == [
        f"Released permit 2 of {limited!r} (was held by worker-2.example:1002, "
        f"lease {shown.lease})."
    ]
    assert "<i>" not in done.content.decode()
    assert permits.peek(permit_key(limited, 2)) is None
    assert permits.peek(permit_key(limited, 0)) is not None  # only the one confirmed
    [entry] = LogEntry.objects.all()
    assert (entry.user, entry.action_flag) == (root, DELETION)
    assert entry.object_repr == f"{limited} (permit 2)"
    assert entry.object_id == f"task-lock:{permit_key(limited, 2)}"
    assert entry.change_message == (
        f"Force-released permit 2 held by worker-2.example:1002 (lease {shown.lease})."
    )


def test_a_link_to_a_limited_key_without_its_permit_names_them(
    permits: BaseBackend, key: str
) -> None:
    two_of_three(permits, key)
    client = client_for(make_user("root", superuser=True))
    for method in ("get", "post"):
        response = getattr(client, method)(
            RELEASE_URL, {"key": key, "lease": "0123456789ab"}, follow=True
        )
        assert texts(response) == [
            f"{key!r} is held as permits, 2 of 3 permits held (number 0, 2): release one of them "
            "from the list. Nothing was released."
        ]
    assert permits.peek(permit_key(key, 0)) is not None
    assert permits.peek(permit_key(key, 2)) is not None
    assert not LogEntry.objects.exists()


def test_release_confirms_the_permit_shown_not_its_successor(
    permits: BaseBackend, key: str
) -> None:
    tokens = two_of_three(permits, key)
    client = client_for(make_user("root", superuser=True))
    fields = form_fields(client.get(RELEASE_URL, {"key": key, "permit": "0"}))
    assert permits.release(permit_key(key, 0), tokens[0])
    assert permits.acquire_permit(
        key,
        "worker-9.example:1009:secret-9",
        limit=3,
        ttl=timedelta(minutes=5),
        max_lifetime=timedelta(hours=1),
    ) == permit_key(key, 0)

    done = client.post(RELEASE_URL, fields, follow=True)

    [message] = texts(done)
    assert message.startswith(
        f"permit 0 of {key!r} changed hands since the page was shown: it is held now by "
        "worker-9.example:1009 since "
    )
    assert message.endswith("Nothing was released.")
    now = permits.peek(permit_key(key, 0))
    assert now is not None
    assert now.holder.host == "worker-9.example"
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("permit", ["-1", "x", "1\x1f", "٣"])
def test_releasing_a_bad_permit(
    memory: BaseBackend, admin_client_: Client, key: str, permit: str
) -> None:
    response = admin_client_.post(
        RELEASE_URL, {"key": key, "permit": permit, "lease": "x"}, follow=True
    )
    assert texts(response)[0].startswith("Cannot release: a permit's number, as the list shows it")


def test_a_key_with_the_separator_is_refused(memory: BaseBackend, admin_client_: Client) -> None:
    """A permit is named by its key and number; never by its stored name."""
    response = admin_client_.get(RELEASE_URL, {"key": "k\x1f0"}, follow=True)
    assert texts(response) == [
        "Cannot release: key must not contain the unit separator ('\\x1f')."
    ]
