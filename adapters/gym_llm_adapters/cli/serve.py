"""``gym-llm serve ENV --port N``: serve a gym_llm env over OpenEnv's HTTP/WebSocket protocol.

Any OpenEnv client drives it (``GenericEnvClient(base_url="http://HOST:N").sync()``, TRL and TorchRL code built on
OpenEnv's clients, or ``gym.make("OpenEnv-v0", base_url=...)``): one env per WebSocket session, text actions
(``{"text": reply}``) and observations (the rendered conversation, the messages, the step's info). A client that
disconnects or stops answering frees its session and env within --ping-interval + --ping-timeout seconds; one that
stays connected but silent, after --idle-timeout. See docs/peers.md.
"""

from __future__ import annotations

import argparse

from gym_llm_adapters.cli._common import add_env_options, env_kwargs_from, non_negative_float, positive_int

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve an env over OpenEnv's protocol (HTTP/WebSocket)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_env_options(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0 for every "
                            "interface: the env runs whatever clients send it, e.g. Python in the tool sandbox)")
    group.add_argument("--port", type=positive_int, default=8000, help="TCP port (default: 8000)")
    group.add_argument("--max-sessions", type=positive_int, default=64,
                       help="most concurrent sessions, one env each; one more is refused with CAPACITY_REACHED "
                            "(default: 64)")
    group.add_argument("--idle-timeout", type=non_negative_float, default=600.0, metavar="S",
                       help="close a session that sends nothing for S seconds; 0 = never (default: 600)")
    group.add_argument("--ping-interval", type=non_negative_float, default=10.0, metavar="S",
                       help="WebSocket ping every S seconds (default: 10)")
    group.add_argument("--ping-timeout", type=non_negative_float, default=10.0, metavar="S",
                       help="drop a client whose pong is S seconds late, freeing its env (default: 10)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    import gym_llm  # noqa: F401  (registers the ids, plugins' included)
    from gym_llm.core.extras import MissingExtraError
    from gym_llm.registration import registered_envs
    from gym_llm_adapters.cli._common import check_paths
    from gym_llm_adapters.cli.errors import UsageError, closest

    ids = [info.id for info in registered_envs()]  # gym-llm's and other packages' (gym_llm.envs entry points)
    if args.env not in ids:
        raise UsageError(f"unknown env id {args.env!r}{closest(args.env, ids)}; the registered ids are: "
                         f"{', '.join(ids)} (`gym-llm list` describes them)")
    if not (args.ping_interval > 0 and args.ping_timeout > 0):
        raise UsageError("--ping-interval and --ping-timeout must be > 0 seconds: they bound how long a vanished "
                         "client keeps its env")
    kwargs = env_kwargs_from(args)
    check_paths(kwargs)
    try:
        from gym_llm.integrations.openenv import create_app
    except MissingExtraError as e:
        raise UsageError(str(e)) from e
    try:
        app = create_app(args.env, kwargs, max_sessions=args.max_sessions,
                         idle_timeout_s=args.idle_timeout or None)
    except MissingExtraError as e:
        raise UsageError(str(e)) from e
    except (TypeError, ValueError, KeyError, OSError, ImportError, RuntimeError) as e:
        raise UsageError(f"{args.env} cannot be served with these env arguments ({type(e).__name__}: {e}); see "
                         "`gym-llm list` and the env's docs for its arguments") from e
    import uvicorn

    level = logging.getLogger().getEffectiveLevel()
    config = uvicorn.Config(app, host=args.host, port=args.port, ws_ping_interval=args.ping_interval,
                            ws_ping_timeout=args.ping_timeout, lifespan="on",
                            log_level="debug" if level <= logging.DEBUG else "warning" if level >= logging.WARNING
                            else "info")
    server = uvicorn.Server(config)
    logging.getLogger("gym_llm_adapters.cli").info(
        "starting the OpenEnv server for %s on http://%s:%d (WebSocket /ws; at most %d sessions)", args.env, args.host,
        args.port, args.max_sessions)
    try:
        server.run()
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: uvicorn has shut down (sessions closed)
        return 0
    except SystemExit:  # uvicorn could not start; it logged why
        if server.started:
            raise
    if not server.started:
        raise UsageError(f"could not listen on {args.host}:{args.port} (is the port taken, is the host this "
                         "machine's?); pick another with --port / --host")
    return 0
