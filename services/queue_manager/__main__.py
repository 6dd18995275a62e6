from services.queue_manager.app import runtime

runtime.main()
