from emergence.main import main

main()
