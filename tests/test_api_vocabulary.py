"""One vocabulary across the API: the names one route takes, its siblings take too, and the
older shapes a bot still sends are read, not dropped."""

from __future__ import annotations

from tests.conftest import AppClient, new_tenant

GROUP = {"request_type": "group", "group_id": "g1", "sender_id": "10001", "sender_name": "张三"}


async def test_end_reads_new_info_given_as_a_list(client: AppClient) -> None:
    tenant = await new_tenant(client)
    response = await client.post(
        "/v1/end",
        json={**GROUP, "request_id": "legacy-1", "new_info": ["我喜欢猫", "我住在杭州"]},
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    assert response.json()["event_ids"] == ["g:g1:legacy-1:1.1", "g:g1:legacy-1:1.2"]
    refused = await client.post(
        "/v1/end", json={**GROUP, "request_id": "legacy-2", "new_info": 5}, headers=tenant.headers
    )
    assert refused.status_code == 422 and "new_info" in refused.text


async def test_event_search_takes_the_ids_as_the_other_searches_name_them(
    client: AppClient,
) -> None:
    tenant = await new_tenant(client)
    context = {"request_type": "group", "group_id": "g1"}
    answers = []
    for ids in ({"target_group_id": "g1"}, {"group_id": "g1"}):
        response = await client.post(
            "/v1/events/search",
            json={"query": "北京", "context": context, **ids},
            headers=tenant.headers,
        )
        assert response.status_code == 200, response.text
        answers.append(response.json())
    assert answers[0] == answers[1]


async def test_message_search_takes_request_type_as_messages_does(client: AppClient) -> None:
    tenant = await new_tenant(client)
    found = await client.post(
        "/v1/messages/search",
        json={"query": "北京", "request_type": "group", "group_id": "g1"},
        headers=tenant.headers,
    )
    assert found.status_code == 200, found.text
    mixed = await client.post(
        "/v1/messages/search",
        json={"query": "北京", "request_type": "private", "group_id": "g1", "user_id": "1"},
        headers=tenant.headers,
    )
    assert mixed.status_code == 422


async def test_openapi_states_the_message_length_the_server_enforces(client: AppClient) -> None:
    document = (await client.get("/schema/openapi.json")).json()
    text = document["components"]["schemas"]["MessageIn"]["properties"]["text"]
    assert "20,000" in text["description"]
