from tfdistx.cli import main

main()
