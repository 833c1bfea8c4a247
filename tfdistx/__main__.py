try:
    from tfdistx.cli import main
except KeyboardInterrupt:  # Ctrl-C as the command starts: one line, as anywhere later (cli.main), no traceback
    import sys

    if sys.argv[1:2] != ["_task"]:  # a local cluster's task: its launcher says it, once
        print("tfdistx: interrupted", file=sys.stderr)
    sys.exit(130)

main()
