"""The fuzz checker (tests/support/fuzzing.py) counts what its docstring says it counts
(issue 23.8): a refused tenant change that still changed the tenants' list is a failure,
and a refusal whose effect could not be read is said (`unchecked`), never taken as clean.
Driven against a small stand-in API (httpx.MockTransport), so each verdict is certain."""

from __future__ import annotations

import json

import httpx

from tests.support.fuzzing import Report, api_cases


class FakeNode:
    """GET /v1/health and /v1/tenants; every POST is refused (403), and one named route
    still changes the list (the bug a checker must see)."""

    def __init__(self, leaky: str | None = None, list_readable: bool = True) -> None:
        self.tenants = [{"name": "alice", "uid": 200001}]
        self.leaky, self.list_readable = leaky, list_readable

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == "/v1/health":
            return httpx.Response(200, json={"next_job_id": 7})
        if request.method == "GET" and path == "/v1/tenants":
            return httpx.Response(200, json=self.tenants) if self.list_readable else \
                httpx.Response(403, json={"detail": "admins only"})
        if request.method == "POST" and self.leaky and path.startswith(self.leaky):
            self.tenants = self.tenants + [{"name": f"t{len(self.tenants)}", "uid": 200000 + len(self.tenants)}]
        return httpx.Response(403, json={"detail": "refused"})


def run(node: FakeNode, routes: list[tuple[str, str]], n: int = 20) -> Report:
    report = Report()
    with httpx.Client(transport=httpx.MockTransport(node), base_url="http://mtgpu") as c:
        api_cases(c, routes, n, 1, report)
    return report


def test_a_refused_tenant_change_that_changed_the_list_is_counted():
    report = run(FakeNode(leaky="/v1/tenants"), [("POST", "/v1/tenants/{name}/remove")])
    assert report.refused == 20 and report.changed_after_refusal == 20, report
    assert report.examples[0]["what"] == "tenants changed after refusal"


def test_refused_tenant_changes_that_change_nothing_are_clean_and_checked():
    report = run(FakeNode(), [("POST", "/v1/tenants"), ("POST", "/v1/join")])
    assert (report.refused, report.changed_after_refusal, report.tenants_unread, report.unchecked) == (20, 0, 0, 0)


def test_a_refusal_whose_effect_cannot_be_read_is_said_not_taken_as_clean():
    report = run(FakeNode(list_readable=False), [("POST", "/v1/tenants/{name}/assign")])
    assert report.changed_after_refusal == 0 and report.tenants_unread == 20, report
    assert json.loads(json.dumps(report.__dict__))["tenants_unread"] == 20  # what the tenant's worker sends back


class StampingNode(FakeNode):
    """Each read of the list finds the tenants' activity stamps moved (the node records
    anyone's activity as it comes: a submission, a login), and, when `leaky`, a refused
    request still changed a tenant's share."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/tenants":
            self.tenants = [{**t, "last_seen_at": t.get("last_seen_at", 0.0) + 1.0, "last_login_at": 5.0,
                             "share": t.get("share", 1.0)} for t in self.tenants]
            return httpx.Response(200, json=self.tenants)
        if request.method == "POST" and self.leaky and request.url.path.startswith(self.leaky):
            self.tenants = [{**t, "share": 2.0} for t in self.tenants]
            return httpx.Response(403, json={"detail": "refused"})
        return super().__call__(request)


def test_activity_stamps_are_not_a_change_but_a_refused_share_change_is_named_by_its_field():
    clean = run(StampingNode(), [("POST", "/v1/tenants/{name}/share")])
    assert (clean.refused, clean.changed_after_refusal, clean.tenants_unread) == (20, 0, 0), clean
    leaky = run(StampingNode(leaky="/v1/tenants/"), [("POST", "/v1/tenants/{name}/share")])
    assert leaky.changed_after_refusal >= 1, leaky


def test_the_difference_of_two_readings_names_each_tenant_and_field():
    from tests.support.fuzzing import tenant_changes

    before = {"alice": {"uid": 1, "share": 1.0}, "bob": {"uid": 2}}
    after = {"alice": {"uid": 1, "share": 2.0}, "carol": {"uid": 3}}
    assert tenant_changes(before, after) == ["bob: removed", "carol: added", "alice.share: 1.0 -> 2.0"]


def test_the_caller_made_a_tenant_by_its_own_first_request_is_not_a_change_anyone_else_is():
    from tests.support.fuzzing import tenant_changes

    assert tenant_changes({}, {"alice": {"uid": 1}}, caller="alice") == []
    assert tenant_changes({}, {"alice": {"uid": 1}, "mallory": {"uid": 2}}, caller="alice") == ["mallory: added"]
    assert tenant_changes({"alice": {"uid": 1}}, {}, caller="alice") == ["alice: removed"]
