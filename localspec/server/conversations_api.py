"""OpenAI's Conversations API (`/v1/conversations`): a conversation's items, kept in memory, that a
Responses request with `conversation` reads first and adds its input and output to.

Create (with up to 20 items and metadata), retrieve, update the metadata, delete; list its items
(newest first, `limit`, `order`, `after`), add items, read or delete one. Items are checked as a
Responses input is (a message, a function or custom tool's call or output, reasoning).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.server.response_store import Conversation
from localspec.server.responses_api import item_page
from localspec.server.schemas import parse_body
from localspec.server.schemas_responses import ConversationBody, ItemsBody, listed_items
from localspec.server.state import server_state


async def create(request: Request) -> Response:
    raw = await request.body()
    # The SDK's create() with nothing sends no body.
    body = parse_body(raw if raw.strip() else b"{}", ConversationBody)
    kept = server_state(request).conversations.create(body.checked_metadata(), listed_items(body.items or ()))
    return JSONResponse(kept.body())


async def retrieve(request: Request) -> Response:
    return JSONResponse(server_state(request).conversations.get(request.path_params["id"]).body())


async def update(request: Request) -> Response:
    metadata = parse_body(await request.body(), ConversationBody).checked_metadata()

    def set_metadata(conversation: Conversation) -> None:
        conversation.metadata = metadata

    changed = server_state(request).conversations.change(request.path_params["id"], set_metadata)
    return JSONResponse(changed.body())


async def delete(request: Request) -> Response:
    conversation_id = request.path_params["id"]
    server_state(request).conversations.delete(conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: Request) -> Response:
    items = server_state(request).conversations.items(request.path_params["id"])
    return JSONResponse(item_page(items, request))


async def add_items(request: Request) -> Response:
    added = listed_items(parse_body(await request.body(), ItemsBody).items)
    server_state(request).conversations.add(request.path_params["id"], added)
    page = {"object": "list", "data": added, "has_more": False}
    return JSONResponse({**page, "first_id": added[0]["id"], "last_id": added[-1]["id"]})


async def retrieve_item(request: Request) -> Response:
    conversations = server_state(request).conversations
    return JSONResponse(conversations.item(request.path_params["id"], request.path_params["item"]))


async def delete_item(request: Request) -> Response:
    conversations = server_state(request).conversations
    return JSONResponse(
        conversations.remove_item(request.path_params["id"], request.path_params["item"]).body()
    )


ROUTES = [
    route
    for prefix in ("/v1", "")
    for route in (
        Route(f"{prefix}/conversations", create, methods=["POST"]),
        Route(f"{prefix}/conversations/{{id}}", retrieve, methods=["GET"]),
        Route(f"{prefix}/conversations/{{id}}", update, methods=["POST"]),
        Route(f"{prefix}/conversations/{{id}}", delete, methods=["DELETE"]),
        Route(f"{prefix}/conversations/{{id}}/items", list_items, methods=["GET"]),
        Route(f"{prefix}/conversations/{{id}}/items", add_items, methods=["POST"]),
        Route(f"{prefix}/conversations/{{id}}/items/{{item}}", retrieve_item, methods=["GET"]),
        Route(f"{prefix}/conversations/{{id}}/items/{{item}}", delete_item, methods=["DELETE"]),
    )
]
