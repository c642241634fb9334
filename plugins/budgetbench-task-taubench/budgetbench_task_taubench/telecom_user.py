"""The telecom user's phone: 30 user tools on ``TelecomUserDB``, the task functions that break
or check it, and ``sync`` (upstream's ``TelecomEnvironment.sync_tools``).

Semantics are upstream's (``src/tau2/domains/telecom/user_tools.py``): every toggle re-runs
the network search, tool outputs end with the status bar, and the speed test is a pure
function of the state. One deliberate difference: ``connect_vpn`` gives the phone a fresh
copy of the default VPN details, where upstream shares one class-level object that
``break_vpn`` degrades for every later episode of the same process.
"""

from __future__ import annotations

from typing import Any

from .telecom import TelecomTools
from .telecom_models import (
    APNNames,
    APNSettings,
    LineStatus,
    MockPhoneAttributes,
    NetworkModePreference,
    NetworkStatus,
    NetworkTechnology,
    PaymentRequest,
    PerformanceLevel,
    SignalStrength,
    SimStatus,
    TelecomUserDB,
    UserSurroundings,
    VpnDetails,
)
from .toolkit import READ, WRITE, Toolkit, tool

SIGNAL_ICONS = {
    SignalStrength.NONE: "📵 No Signal",
    SignalStrength.POOR: "📶¹ Poor",
    SignalStrength.FAIR: "📶² Fair",
    SignalStrength.GOOD: "📶³ Good",
    SignalStrength.EXCELLENT: "📶⁴ Excellent",
}
SPEED_RANGE = {  # Mbps, by technology
    NetworkTechnology.TWO_G: (0.1, 0.4),
    NetworkTechnology.THREE_G: (1.0, 5.0),
    NetworkTechnology.FOUR_G: (10.0, 100.0),
    NetworkTechnology.FIVE_G: (50.0, 500.0),
    NetworkTechnology.NONE: (0.0, 0.0),
}
SIGNAL_FACTOR = {
    SignalStrength.POOR: 0.2,
    SignalStrength.FAIR: 0.5,
    SignalStrength.GOOD: 0.8,
    SignalStrength.EXCELLENT: 1.0,
    SignalStrength.NONE: 0.0,
}
SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
MODE_TECHNOLOGY = {
    NetworkModePreference.FOUR_G_ONLY: NetworkTechnology.FOUR_G,
    NetworkModePreference.THREE_G_ONLY: NetworkTechnology.THREE_G,
    NetworkModePreference.TWO_G_ONLY: NetworkTechnology.TWO_G,
}
SIM_TEXT = {
    SimStatus.ACTIVE: "Your SIM card is active and working.",
    SimStatus.MISSING: "No SIM card detected in the phone.",
    SimStatus.LOCKED_PIN: "The SIM card is locked with a PIN code.",
    SimStatus.LOCKED_PUK: "The SIM card is locked with a PUK code.",
}


def _default_vpn() -> VpnDetails:
    return VpnDetails(server_address="192.168.1.1", protocol="OpenVPN", server_performance=PerformanceLevel.EXCELLENT)


class TelecomUserTools(Toolkit):
    db: TelecomUserDB

    @property
    def device(self) -> MockPhoneAttributes:
        return self.db.device

    @property
    def surroundings(self) -> UserSurroundings:
        return self.db.surroundings

    def _with_bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {self._status_bar()}"

    def _status_bar(self) -> str:
        device, parts = self.device, []
        if device.airplane_mode:
            parts.append("✈️ Airplane Mode")
        else:
            parts.append(SIGNAL_ICONS.get(device.network_signal_strength, "📵 No Signal"))
            connected = device.network_technology_connected != NetworkTechnology.NONE
            if connected:
                parts.append(device.network_technology_connected.value)
            if device.data_enabled and connected:
                parts.append("📱 Data Enabled")
                if device.data_saver_mode:
                    parts.append("🔽 Data Saver")
            else:
                parts.append("📵 Data Disabled")
        if device.wifi_enabled and device.wifi_connected:
            parts.append(f"📡 Connected to {device.wifi_ssid}" if device.wifi_ssid else "📡 Enabled")
        if device.vpn_connected:
            parts.append("🔒 VPN Connected")
        parts.append(f"🔋 {device.battery_level}%")
        return " | ".join(parts)

    def _sim_status(self) -> SimStatus:
        return SimStatus.MISSING if self.device.sim_card_missing else self.device.sim_card_status

    def _no_service(self) -> None:
        self.device.network_connection_status = NetworkStatus.NO_SERVICE
        self.device.network_technology_connected = NetworkTechnology.NONE
        self.device.network_signal_strength = SignalStrength.NONE

    def simulate_network_search(self) -> None:
        """The network the phone finds for its SIM, mode preference, airplane mode, APN and line."""
        device, signal = self.device, self.surroundings.signal_strength
        if self._sim_status() == SimStatus.ACTIVE:
            device.network_connection_status = NetworkStatus.CONNECTED
            technology = MODE_TECHNOLOGY.get(device.network_mode_preference, NetworkTechnology.FOUR_G)
            if device.network_mode_preference == NetworkModePreference.FOUR_G_5G_PREFERRED:
                five_g = signal.get(NetworkTechnology.FIVE_G, SignalStrength.NONE)
                technology = NetworkTechnology.FOUR_G if five_g == SignalStrength.NONE else NetworkTechnology.FIVE_G
            device.network_technology_connected = technology
            device.network_signal_strength = signal.get(technology, SignalStrength.NONE)
        else:
            self._no_service()
        if (
            device.airplane_mode
            or device.active_apn_settings.apn_name == APNNames.BROKEN
            or not self.surroundings.line_active
        ):
            self._no_service()

    def _mobile_data_working(self) -> bool:
        device, around = self.device, self.surroundings
        if device.airplane_mode or device.network_signal_strength == SignalStrength.NONE:
            return False
        if device.network_connection_status == NetworkStatus.NO_SERVICE:
            return False
        if around.is_abroad and (not device.roaming_enabled or not around.roaming_allowed):
            return False
        return device.data_enabled and not around.mobile_data_usage_exceeded

    def _speed(self) -> tuple[float | None, str]:
        if not self._mobile_data_working():
            return None, "No Connection"
        device = self.device
        factor = 1.0
        if (
            device.vpn_connected
            and device.vpn_details
            and device.vpn_details.server_performance == PerformanceLevel.POOR
        ):
            factor = 0.1
        if device.data_saver_mode:
            factor *= 0.2
        low, high = SPEED_RANGE.get(device.network_technology_connected, (0.0, 0.0))
        speed = round((low + high) / 2.0 * SIGNAL_FACTOR.get(device.network_signal_strength, 0.0) * factor, 2)
        for limit, text in ((1, "Very Poor"), (5, "Poor"), (25, "Fair"), (100, "Good")):
            if speed < limit:
                return speed, text
        return speed, "Excellent"

    def _can_send_mms(self) -> bool:
        device = self.device
        if not self._mobile_data_working() or device.network_technology_connected == NetworkTechnology.TWO_G:
            return False
        if device.wifi_calling_enabled and device.wifi_calling_mms_over_wifi:
            return False
        if device.active_apn_settings.mmsc_url is None:
            return False
        app = device.app_statuses.get("messaging")
        return app is not None and app.permissions.storage and app.permissions.sms

    def _toggle_airplane(self) -> bool:
        device = self.device
        was_on = device.airplane_mode
        device.airplane_mode = not was_on
        if was_on:
            device.network_connection_status = NetworkStatus.SEARCHING
        if not was_on or device.wifi_enabled:
            device.wifi_connected, device.wifi_ssid, device.wifi_signal_strength = False, None, SignalStrength.NONE
        if not was_on and device.vpn_connected:
            self._disconnect_vpn()
        self.simulate_network_search()
        return device.airplane_mode

    def _toggle(self, field: str, search: bool = True) -> bool:
        value = not getattr(self.device, field)
        setattr(self.device, field, value)
        if search:
            self.simulate_network_search()
        return value

    def _disconnect_vpn(self) -> bool:
        if not self.device.vpn_connected:
            return False
        self.device.vpn_connected, self.device.vpn_details = False, None
        return True

    # -- tools ---------------------------------------------------------------------------

    @tool(
        READ,
        "Shows what icons are currently visible in your phone's status bar (the area at the top of the screen). "
        "Displays network signal strength, mobile data status (enabled, disabled, data saver), Wi-Fi status, "
        "and battery level.",
    )
    def check_status_bar(self) -> str:
        return f"Status Bar: {self._status_bar()}"

    @tool(
        READ,
        "Checks your phone's connection status to cellular networks and Wi-Fi. Shows airplane mode status, "
        "signal strength, network type, whether mobile data is enabled, and whether data roaming is enabled.",
    )
    def check_network_status(self) -> str:
        device = self.device
        lines = [
            f"Airplane Mode: {'ON' if device.airplane_mode else 'OFF'}",
            f"SIM Card Status: {self._sim_status().value}",
            f"Cellular Connection: {device.network_connection_status.value}",
            f"Cellular Signal: {device.network_signal_strength.value}",
            f"Cellular Network Type: {device.network_technology_connected.value}",
            f"Mobile Data Enabled: {'Yes' if device.data_enabled else 'No'}",
            f"Data Roaming Enabled: {'Yes' if device.roaming_enabled else 'No'}",
            f"Wi-Fi Radio: {'ON' if device.wifi_enabled else 'OFF'}",
            f"Wi-Fi Connected: {'Yes' if device.wifi_connected else 'No'}",
        ]
        if device.wifi_connected:
            lines.append(f"Connected Wi-Fi Network: {device.wifi_ssid}")
        return "\n".join(lines)

    @tool(READ, "Shows the current network mode preference.")
    def check_network_mode_preference(self) -> str:
        return f"Network Mode Preference: {self.device.network_mode_preference.value}"

    @tool(
        WRITE,
        "Changes the type of cellular network your phone prefers to connect to (e.g., 5G, LTE/4G, 3G). "
        "Higher-speed networks (LTE/5G) provide faster data but may use more battery.",
        {"mode": "One of: 4g_5g_preferred, 4g_only, 3g_only, 2g_only."},
    )
    def set_network_mode_preference(self, mode: NetworkModePreference | str) -> str:
        try:
            valid = NetworkModePreference(mode)
        except ValueError:
            options = ", ".join(m.value for m in NetworkModePreference)
            return self._with_bar(
                f"Failed to set network mode: '{mode}' is not a valid option. Please use one of: {options}"
            )
        self.device.network_mode_preference = valid
        self.simulate_network_search()
        return self._with_bar(f"Preferred Network Mode set to: {valid.value}")

    @tool(
        READ,
        "Measures your current internet connection speed (download speed). Provides information about "
        "connection quality and what activities it can support.",
    )
    def run_speed_test(self) -> str:
        speed, text = self._speed()
        if speed is None:
            return f"Speed test failed: {text or 'Could not determine speed'}."
        return f"Speed Test Result: {speed:.2f} Mbps ({text}). {SPEED_ADVICE.get(text, '')}"

    @tool(
        WRITE,
        "Toggles Airplane Mode ON or OFF. When ON, it disconnects all wireless communications including "
        "cellular, Wi-Fi, and Bluetooth. Returns the new state of airplane_mode.",
    )
    def toggle_airplane_mode(self) -> str:
        return self._with_bar(f"Airplane Mode is now {'ON' if self._toggle_airplane() else 'OFF'}.")

    @tool(
        READ,
        "Checks if your SIM card is working correctly and displays its current status. Shows if the SIM is "
        "active, missing, or locked with a PIN or PUK code.",
    )
    def check_sim_status(self) -> str:
        status = self._sim_status()
        return SIM_TEXT.get(status, f"Unknown SIM status: {status.value}")

    @tool(WRITE, "Simulates removing and reinserting your SIM card. This can help resolve recognition issues.")
    def reseat_sim_card(self) -> str:
        self.device.sim_card_missing = False
        self.simulate_network_search()
        return self._with_bar("SIM card re-seated successfully.")

    @tool(
        WRITE,
        "Toggles your phone's mobile data connection ON or OFF. Controls whether your phone can use cellular "
        "data for internet access when Wi-Fi is unavailable. Returns the new data connection status.",
    )
    def toggle_data(self) -> str:
        return self._with_bar(f"Mobile Data is now {'ON' if self._toggle('data_enabled') else 'OFF'}.")

    @tool(
        WRITE,
        "Toggles Data Roaming ON or OFF. When ON, your phone can use data networks in areas outside your "
        "carrier's coverage. Returns the new data roaming status.",
    )
    def toggle_roaming(self) -> str:
        return self._with_bar(f"Data Roaming is now {'ON' if self._toggle('roaming_enabled') else 'OFF'}.")

    @tool(READ, "Checks if your phone has any data-limiting features active. Shows if Data Saver mode is on.")
    def check_data_restriction_status(self) -> str:
        return (
            "Data Saver mode is ON (limits data usage)." if self.device.data_saver_mode else "Data Saver mode is OFF."
        )

    @tool(
        WRITE,
        "Toggles Data Saver mode ON or OFF. When ON, it reduces data usage, which may affect data speed. "
        "Returns the new data saver mode status.",
    )
    def toggle_data_saver_mode(self) -> str:
        return self._with_bar(f"Data Saver Mode is now {'ON' if self._toggle('data_saver_mode', False) else 'OFF'}.")

    @tool(
        READ,
        "Checks the technical APN settings your phone uses to connect to your carrier's mobile data network. "
        "Shows current APN name and MMSC URL for picture messaging.",
    )
    def check_apn_settings(self) -> str:
        settings = self.device.active_apn_settings
        return (
            f"Current APN Name: {settings.apn_name.value or 'Not Set'}\n"
            f"MMSC URL (for picture messages): {settings.mmsc_url or 'Not Set'}\n"
            "(These are technical settings, usually best left unchanged.)"
        )

    @tool(WRITE, "Sets the APN settings for the phone.", {"apn_settings": "The APN settings, as an object."})
    def set_apn_settings(self, apn_settings: APNSettings | dict) -> str:
        if isinstance(apn_settings, dict):
            apn_settings = APNSettings(**apn_settings)
        self.device.active_apn_settings = apn_settings
        self.simulate_network_search()
        return self._with_bar(f"APN settings set to: {apn_settings.apn_name.value}")

    @tool(WRITE, "Resets your APN settings to the default settings.")
    def reset_apn_settings(self) -> str:
        self.device.active_apn_settings.reset_at_reboot = True
        self.simulate_network_search()
        return self._with_bar("APN settings will reset at reboot.")

    @tool(
        READ,
        "Checks your Wi-Fi connection status. Shows if Wi-Fi is turned on, which network you're connected to "
        "(if any), and the signal strength.",
    )
    def check_wifi_status(self) -> str:
        device = self.device
        if not device.wifi_enabled:
            return "Wi-Fi is turned OFF."
        if device.wifi_connected:
            return f"Wi-Fi is ON and connected to '{device.wifi_ssid}'. Signal strength: {device.wifi_signal_strength.value}."
        return "Wi-Fi is ON but not connected to any network."

    @tool(
        WRITE,
        "Toggles your phone's Wi-Fi radio ON or OFF. Controls whether your phone can discover and connect to "
        "wireless networks for internet access. Returns the new Wi-Fi status.",
    )
    def toggle_wifi(self) -> str:
        device = self.device
        if device.airplane_mode:
            return self._with_bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        device.wifi_enabled = not device.wifi_enabled
        if not device.wifi_enabled:
            device.wifi_connected, device.wifi_ssid, device.wifi_signal_strength = False, None, SignalStrength.NONE
        return self._with_bar(f"Wi-Fi is now {'ON' if device.wifi_enabled else 'OFF'}.")

    @tool(
        READ,
        "Checks if Wi-Fi Calling is enabled on your device. This feature allows you to make and receive calls "
        "over a Wi-Fi network instead of using the cellular network.",
    )
    def check_wifi_calling_status(self) -> str:
        return f"Wi-Fi Calling is currently turned {'ON' if self.device.wifi_calling_enabled else 'OFF'}."

    @tool(
        WRITE,
        "Toggles Wi-Fi Calling ON or OFF. This feature allows you to make and receive calls over Wi-Fi instead "
        "of the cellular network, which can help in areas with weak cellular signal. Returns the new Wi-Fi "
        "Calling status.",
    )
    def toggle_wifi_calling(self) -> str:
        return self._with_bar(f"Wi-Fi Calling is now {'ON' if self._toggle('wifi_calling_enabled', False) else 'OFF'}.")

    @tool(
        READ,
        "Checks if you're using a VPN (Virtual Private Network) connection. Shows if a VPN is active, "
        "connected, and displays any available connection details.",
    )
    def check_vpn_status(self) -> str:
        device = self.device
        if device.vpn_connected:
            if device.vpn_details:
                return f"VPN is ON and connected. Details: {device.vpn_details.model_dump()}"
            return "VPN is ON and connected (no specific details available)."
        if device.vpn_enabled_setting:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    @tool(WRITE, "Connects to your VPN (Virtual Private Network).")
    def connect_vpn(self) -> str:
        if self.device.vpn_connected:
            return "VPN already connected."
        self.device.vpn_connected, self.device.vpn_details = True, _default_vpn()
        return self._with_bar("VPN connected successfully.")

    @tool(
        WRITE,
        "Disconnects any active VPN (Virtual Private Network) connection. Stops routing your internet traffic "
        "through a VPN server, which might affect connection speed or access to content.",
    )
    def disconnect_vpn(self) -> str:
        done = self._disconnect_vpn()
        return self._with_bar("VPN disconnected successfully." if done else "No active VPN connection to disconnect.")

    @tool(READ, "Returns the name of all installed apps on the phone.")
    def check_installed_apps(self) -> str:
        return f"The following apps are installed on the phone: {', '.join(self.device.app_statuses)}"

    def _granted(self, app_name: str) -> list[str] | None:
        app = self.device.app_statuses.get(app_name)
        if app is None:
            return None
        return [name.replace("_", " ").lower() for name, on in app.permissions.model_dump().items() if on]

    @tool(
        READ,
        "Checks detailed information about a specific app. Shows its permissions and background data usage settings.",
        {"app_name": "The name of the app."},
    )
    def check_app_status(self, app_name: str) -> str:
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        lines = [f"Status for App: {app_name}"]
        lines += (
            [" - Permissions Granted:", *(f"   - {p}" for p in granted)]
            if granted
            else [" - Permissions: None granted."]
        )
        return "\n".join(lines)

    @tool(
        READ,
        "Checks what permissions a specific app currently has. Shows if the app has access to features like "
        "storage, camera, location, etc.",
        {"app_name": "The name of the app."},
    )
    def check_app_permissions(self, app_name: str) -> str:
        granted = self._granted(app_name)
        if granted is None:
            return f"App '{app_name}' not found on this phone."
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    @tool(
        WRITE,
        "Gives a specific permission to an app (like access to storage, camera, or location). Required for "
        "some app functions to work properly.",
        {
            "app_name": "The name of the app to grant the permission to.",
            "permission": "The permission to grant, should be lowercase.",
        },
    )
    def grant_app_permission(self, app_name: str, permission: str) -> str:
        app, permission = self.device.app_statuses.get(app_name), permission.lower()
        if app is None:
            message = f"Error. App '{app_name}' not found. Cannot grant permission."
        elif permission not in (available := list(app.permissions.model_dump())):
            message = (
                f"Error. Permission '{permission}' not tracked for app '{app_name}', available permissions: {available}"
            )
        else:
            setattr(app.permissions, permission, True)
            message = f"Success. Permission '{permission}' granted to app '{app_name}'."
        return self._with_bar(message)

    @tool(READ, "Checks if the default messaging app can send MMS messages.")
    def can_send_mms(self) -> str:
        can = self._can_send_mms()
        return f"Your messaging app {'can' if can else 'cannot'} send MMS messages."

    @tool(
        WRITE,
        "Restarts your phone completely. This can help resolve many temporary software glitches by refreshing "
        "all running services and connections.",
    )
    def reboot_device(self) -> str:
        lines = []
        if self.device.active_apn_settings.reset_at_reboot:
            lines.append("Resetting APN settings...")
            self.device.active_apn_settings = APNSettings()
        lines.append("Restarting network services...")
        self.device.network_connection_status = NetworkStatus.SEARCHING
        self.simulate_network_search()
        return self._with_bar("\n".join(lines))

    @tool(READ, "Checks if the agent has sent you a payment request.")
    def check_payment_request(self) -> str:
        request = self.surroundings.payment_request
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request.bill_id} of {request.amount_due} USD."

    @tool(WRITE, "Makes a payment for the bill that the agent has sent you.")
    def make_payment(self) -> str:
        request = self.surroundings.payment_request
        if request is None:
            return "You do not have a payment request."
        request.paid = True
        return f"Payment of {request.amount_due} USD has been made for bill {request.bill_id}."

    # -- task set-up (not tools) ---------------------------------------------------------------

    def set_user_info(self, name: str, phone_number: str) -> None:
        self.surroundings.name, self.surroundings.phone_number = name, phone_number

    def set_user_location(self, abroad: bool) -> None:
        self.surroundings.is_abroad = abroad

    def _force(self, toggle: Any, want: bool) -> None:
        if toggle() != want:
            toggle()

    def turn_airplane_mode_on(self) -> str:
        self._force(self._toggle_airplane, True)
        return "Airplane Mode is now ON."

    def turn_airplane_mode_off(self) -> str:
        self._force(self._toggle_airplane, False)
        return "Airplane Mode is now OFF."

    def unseat_sim_card(self) -> str:
        self.device.sim_card_missing = True
        self.simulate_network_search()
        return "SIM card un-seated successfully."

    def lock_sim_card(self, mode: str) -> str:
        self.device.sim_card_status = {"pin": SimStatus.LOCKED_PIN, "puk": SimStatus.LOCKED_PUK}.get(
            mode, self.device.sim_card_status
        )
        self.simulate_network_search()
        return f"SIM card locked successfully in {mode} mode."

    def turn_data_on(self) -> str:
        self.device.data_enabled = True
        return "Data connection restored."

    def turn_data_off(self) -> str:
        self._force(lambda: self._toggle("data_enabled"), False)
        return "Data connection broken."

    def turn_roaming_on(self) -> str:
        self._force(lambda: self._toggle("roaming_enabled"), True)
        return "Data Roaming is now ON."

    def turn_roaming_off(self) -> str:
        self._force(lambda: self._toggle("roaming_enabled"), False)
        return "Data Roaming is now OFF."

    def turn_data_saver_mode_on(self) -> str:
        self._force(lambda: self._toggle("data_saver_mode", False), True)
        return "Data Saver Mode is now ON."

    def turn_data_saver_mode_off(self) -> str:
        self._force(lambda: self._toggle("data_saver_mode", False), False)
        return "Data Saver Mode is now OFF."

    def break_apn_settings(self) -> str:
        self.device.active_apn_settings.apn_name = APNNames.BROKEN
        self.simulate_network_search()
        return "APN settings broken. Please call reset_apn_settings() to fix."

    def break_apn_mms_setting(self) -> str:
        self.device.active_apn_settings.mmsc_url = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        if self.device.wifi_calling_enabled != enabled:
            self._toggle("wifi_calling_enabled", False)
        message = f"Wi-Fi Calling is now {'ON' if enabled else 'OFF'}."
        if mms_over_wifi is not None:
            self.device.wifi_calling_mms_over_wifi = mms_over_wifi
            message += f"\nMMS over Wi-Fi is now {'ON' if mms_over_wifi else 'OFF'}."
        return message

    def break_vpn(self) -> str:
        self.connect_vpn()
        self.device.vpn_details.server_performance = PerformanceLevel.POOR
        return "VPN connection broken."

    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        app, permission = self.device.app_statuses.get(app_name), permission.lower()
        if app is None:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if not hasattr(app.permissions, permission):
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        setattr(app.permissions, permission, False)
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    # -- assertions (not tools) ---------------------------------------------------------------

    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        return self.device.airplane_mode == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        return self.device.network_connection_status == NetworkStatus(expected_status)

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        return self._mobile_data_working() == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        return self.device.roaming_enabled == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        return self.device.data_saver_mode == expected_status

    def assert_internet_speed(self, expected_speed: float, expected_desc: str | None = None) -> bool:
        speed, text = self._speed()
        speed = speed or 0.0
        return speed >= expected_speed and (expected_desc is None or text.lower() == expected_desc.lower())

    def assert_internet_not_excellent(self) -> bool:
        return self._speed()[1].lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        return self._can_send_mms() == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        return self.surroundings.mobile_data_usage_exceeded == expected_status


def sync(tools: TelecomTools, user: TelecomUserTools) -> None:
    """Upstream's ``sync_tools``: the phone learns the line's status, roaming permission and data
    allowance from the carrier; a paid payment request marks its bill paid; a bill awaiting
    payment becomes the phone's payment request."""
    around = user.surroundings
    if around.phone_number is None:
        return
    line = tools._line_by_phone(around.phone_number)
    around.line_active = line.status == LineStatus.ACTIVE
    around.roaming_allowed = bool(line.roaming_enabled)
    plan = tools._plan(line.plan_id)
    around.mobile_data_usage_exceeded = line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
    if around.payment_request is not None and around.payment_request.paid:
        tools.set_bill_to_paid(around.payment_request.bill_id)
        around.payment_request = None
    if around.payment_request is None:
        bills = tools.bills_awaiting_payment(tools.get_customer_by_phone(around.phone_number))
        if bills:
            around.payment_request = PaymentRequest(bill_id=bills[0].bill_id, amount_due=bills[0].total_due)
