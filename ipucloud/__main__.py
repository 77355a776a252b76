from ipucloud.cli import main

main()
