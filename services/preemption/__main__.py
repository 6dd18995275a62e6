from services.preemption.app import runtime

runtime.main()
