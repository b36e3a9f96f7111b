from impactrl.cli import main

main()
