from harness.program import main

main()
