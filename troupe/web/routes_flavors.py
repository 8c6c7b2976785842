"""``/api/flavors``: named sizes a node (``resources.flavor``) or a run
(``options.target.flavor``) asks for. Read again each time a run is built, so an edit
changes what the next run gets and nothing that already started."""

from __future__ import annotations

from aiohttp import web

from troupe.actors.errors import FlavorNotFound
from troupe.actors.store.flavors import CreateFlavor, DeleteFlavor, ListFlavors, ReplaceFlavor
from troupe.protocol.errors import StateConflict
from troupe.protocol.flavors import Flavor, FlavorUpdate
from troupe.web.context import services
from troupe.web.errors import json_reply
from troupe.web.requests import read_model

routes = web.RouteTableDef()
FLAVOR_PATH = r"/api/flavors/{name:[^/]+}"


@routes.get("/api/flavors")
async def list_flavors(request: web.Request) -> web.Response:
    found = await services(request).store.read(ListFlavors())
    return json_reply({"flavors": list(found.values())})


@routes.post("/api/flavors")
async def create_flavor(request: web.Request) -> web.Response:
    body = await read_model(request, Flavor)
    return json_reply(await services(request).store.write(CreateFlavor(body.model_dump())), status=201)


@routes.get(FLAVOR_PATH)
async def get_flavor(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    found = await services(request).store.read(ListFlavors((name,)))
    if name not in found:
        raise FlavorNotFound(f"no flavor named {name!r}")
    return json_reply(found[name])


@routes.put(FLAVOR_PATH)
async def replace_flavor(request: web.Request) -> web.Response:
    """The whole flavor: a quantity left out is unset. A body that repeats the flavor's
    own name (an editor writing the object back as it read it) is accepted."""
    name = request.match_info["name"]
    body = await read_model(request, FlavorUpdate)
    if body.name is not None and body.name != name:
        # 409: the body is well formed, but it describes another flavor than the one addressed.
        raise StateConflict(f"the body names flavor {body.name!r} but the path {name!r}; a flavor is renamed by "
                            "creating the new name and deleting the old", pointer="/name", code="name_mismatch")
    return json_reply(await services(request).store.write(ReplaceFlavor({**body.model_dump(), "name": name})))


@routes.delete(FLAVOR_PATH)
async def delete_flavor(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await services(request).store.write(DeleteFlavor(name))
    return json_reply({"name": name, "deleted": True})
